//! Text-only mode (`text_calls=<dialect>`), free of any wire format: reading the tool catalog a
//! prompt-based client wrote into its system prompt, reading `PTK_RESULT:` headers, and writing
//! the mock's calls as text.

use serde_json::{Map, Value, json};

use super::engine::Reply;
use toolloop::message::ToolCall;
use toolloop::model::ToolSpec;
use toolloop::ptk::{self, Dialect};

/// The start of the catalog [`ptk::render_system_prompt`] writes.
const CATALOG: &str = "# Tools\n\nYou have access to these tools:\n";
/// The start of the part of the catalog that follows the tools.
const HOW_TO: &str = "\n# How to call a tool\n";
/// What introduces the catalog's example call.
const EXAMPLE: &str = "For example:\n\n";
/// What starts a tool-result message.
pub(crate) const RESULT: &str = "PTK_RESULT:";

/// A tool read from a catalog: its name, its parameters as a JSON Schema, and the arguments the
/// mock calls it with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CatalogTool {
    pub spec: ToolSpec,
    /// A schema whose sample ([`toolloop::schema::sample`]) is the arguments: `{"default": args}`.
    pub arguments: Value,
}

/// Reads the tools from a system prompt holding a catalog written by
/// [`ptk::render_system_prompt`]: each `## NAME` section, its parameter lines
/// (`  - NAME: TYPE (required|optional)[ - description][ (default: JSON)]`, and
/// `    JSON Schema: {…}` under a complex one). The arguments the mock sends are the required
/// parameters and those with a default, sampled from their types; for the tool the catalog's
/// example call names, the example's arguments (built by the client from the real schema).
/// No catalog: no tools.
pub(crate) fn read_catalog(system: &str) -> Vec<CatalogTool> {
    let Some(start) = system.find(CATALOG) else {
        return Vec::new();
    };
    let rest = &system[start + CATALOG.len()..];
    let (tools_part, after) = match rest.find(HOW_TO) {
        Some(end) => (&rest[..end], &rest[end..]),
        None => (rest, ""),
    };
    let mut tools: Vec<Builder> = Vec::new();
    let mut in_params = false;
    for line in tools_part.lines() {
        if let Some(name) = line.strip_prefix("## ") {
            tools.push(Builder::new(name.trim()));
            in_params = false;
            continue;
        }
        let Some(tool) = tools.last_mut() else {
            continue;
        };
        if line == "Parameters:" {
            in_params = true;
        } else if line.starts_with("Parameters: ") {
            in_params = false;
        } else if in_params && let Some(param) = line.strip_prefix("  - ") {
            tool.param(param);
        } else if in_params && let Some(schema) = line.strip_prefix("    JSON Schema: ") {
            tool.schema_line(schema);
        } else if !in_params {
            tool.description.push_str(line);
            tool.description.push('\n');
        }
    }
    let mut tools: Vec<CatalogTool> = tools.into_iter().map(Builder::build).collect();
    // The example call carries arguments sampled from the real schema: the best there is.
    if let Some(example) = after.split_once(EXAMPLE).map(|(_, e)| e) {
        let example = example.split("\n\n- ").next().unwrap_or(example);
        let specs: Vec<ToolSpec> = tools.iter().map(|t| t.spec.clone()).collect();
        for call in ptk::parse_reply(example, &specs).calls {
            if let Some(tool) = tools.iter_mut().find(|t| t.spec.name == call.name) {
                tool.arguments = json!({ "default": call.arguments });
            }
        }
    }
    tools
}

struct Builder {
    name: String,
    description: String,
    properties: Map<String, Value>,
    required: Vec<String>,
    /// Parameters the mock fills in: the required ones and those with a default.
    filled: Vec<String>,
    last: Option<String>,
}

impl Builder {
    fn new(name: &str) -> Builder {
        Builder {
            name: name.to_string(),
            description: String::new(),
            properties: Map::new(),
            required: Vec::new(),
            filled: Vec::new(),
            last: None,
        }
    }

    fn param(&mut self, line: &str) {
        let Some((name, rest)) = line.split_once(": ") else {
            return;
        };
        let marks = [(" (required)", true), (" (optional)", false)];
        let Some((at, mark, required)) = marks
            .iter()
            .filter_map(|(m, r)| rest.find(m).map(|at| (at, *m, *r)))
            .min_by_key(|(at, _, _)| *at)
        else {
            return;
        };
        let mut schema = type_schema(&rest[..at]);
        let tail = &rest[at + mark.len()..];
        let default = tail
            .rfind(" (default: ")
            .and_then(|i| tail[i + " (default: ".len()..].strip_suffix(')'))
            .and_then(|d| serde_json::from_str::<Value>(d).ok());
        if let (Some(d), Value::Object(obj)) = (&default, &mut schema) {
            obj.insert("default".into(), d.clone());
        }
        let name = name.to_string();
        if required {
            self.required.push(name.clone());
        }
        if required || default.is_some() {
            self.filled.push(name.clone());
        }
        self.properties.insert(name.clone(), schema);
        self.last = Some(name);
    }

    fn schema_line(&mut self, text: &str) {
        if let (Some(name), Ok(schema @ Value::Object(_))) =
            (&self.last, serde_json::from_str::<Value>(text))
        {
            if schema.get("default").is_some() && !self.filled.contains(name) {
                self.filled.push(name.clone());
            }
            self.properties.insert(name.clone(), schema);
        }
    }

    fn build(self) -> CatalogTool {
        let filled: Map<String, Value> = self
            .properties
            .iter()
            .filter(|(k, _)| self.filled.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let args = toolloop::schema::sample(&json!({"type": "object", "properties": filled}));
        CatalogTool {
            spec: ToolSpec {
                name: self.name,
                description: self.description.trim().to_string(),
                parameters: json!({
                    "type": "object",
                    "properties": self.properties,
                    "required": self.required,
                }),
            },
            arguments: json!({ "default": args }),
        }
    }
}

/// A JSON Schema from a type as the catalog describes it: `string`, `array of integer`,
/// `one of "a", "b"`, `string or null`, `any`.
fn type_schema(described: &str) -> Value {
    let t = described.trim();
    if let Some(values) = t.strip_prefix("one of ") {
        return match serde_json::from_str::<Value>(&format!("[{values}]")) {
            Ok(list @ Value::Array(_)) => json!({ "enum": list }),
            _ => json!({}),
        };
    }
    if let Some(items) = t.strip_prefix("array of ") {
        return json!({"type": "array", "items": type_schema(items)});
    }
    let first = t.split(" or ").find(|x| *x != "null").unwrap_or(t).trim();
    match first {
        "string" | "integer" | "number" | "boolean" | "object" | "array" | "null" => {
            json!({ "type": first })
        }
        _ => json!({}),
    }
}

/// Whether a user message's text is a tool-result message.
pub(crate) fn is_results(text: &str) -> bool {
    text.trim_start().starts_with(RESULT)
}

/// The `(name, call id)` of each `PTK_RESULT: NAME (call id: ID[, error])` header line, in order;
/// `Err` with the line that does not read as a header.
pub(crate) fn result_headers(text: &str) -> Result<Vec<(&str, &str)>, &str> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix(RESULT) else {
            continue;
        };
        let header = rest
            .trim()
            .split_once(" (call id: ")
            .and_then(|(name, tail)| {
                let id = tail.strip_suffix(')')?;
                let id = id.strip_suffix(", error").unwrap_or(id);
                (!name.is_empty() && !id.is_empty()).then_some((name, id))
            });
        match header {
            Some(h) => out.push(h),
            None => return Err(line),
        }
    }
    Ok(out)
}

/// The reply in text-only form: calls become a sentence and the calls written in `dialect`.
pub(crate) fn as_text(reply: Reply<'_>, dialect: Dialect) -> Reply<'_> {
    match reply {
        Reply::Text(text) => Reply::Text(text),
        Reply::Calls(calls) => {
            let names: Vec<&str> = calls.iter().map(|c| c.name).collect();
            let calls: Vec<ToolCall> = calls
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id,
                    name: c.name.to_string(),
                    arguments: c.arguments,
                    invalid_arguments: None,
                    provider_data: None,
                })
                .collect();
            Reply::Text(format!(
                "I'll call {}.\n{}",
                names.join(", "),
                ptk::write_calls(dialect, &calls)
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "read_file".into(),
                description: "Read content of a file".into(),
                parameters: json!({"type": "object", "properties": {
                    "path": {"type": "string", "examples": ["package.json"]},
                    "limit": {"type": "integer", "default": 20},
                }, "required": ["path"]}),
            },
            ToolSpec {
                name: "search".into(),
                description: "Search.\nTwo lines.".into(),
                parameters: json!({"type": "object", "properties": {
                    "mode": {"enum": ["fast", "slow"]},
                    "n": {"type": "integer", "default": 3},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "filter": {"type": "object", "properties": {"x": {"type": "integer"}}},
                    "q": {"type": "string"},
                }, "required": ["mode", "q", "filter"]}),
            },
        ]
    }

    #[test]
    fn the_catalog_gives_back_the_tools_and_fitting_arguments() {
        for dialect in Dialect::ALL {
            let prompt = format!(
                "Be brief.\n\n{}",
                ptk::render_system_prompt(&tools(), dialect)
            );
            let read = read_catalog(&prompt);
            assert_eq!(read.len(), 2, "{dialect}");
            assert_eq!(read[0].spec.name, "read_file");
            assert_eq!(read[1].spec.description, "Search.\nTwo lines.");
            // The example call's arguments, for the first tool.
            assert_eq!(
                toolloop::schema::sample(&read[0].arguments),
                json!({"path": "package.json", "limit": 20}),
                "{dialect}"
            );
            assert_eq!(
                toolloop::schema::sample(&read[1].arguments),
                json!({"mode": "fast", "n": 3, "q": "a", "filter": {"x": 0}}),
                "{dialect}"
            );
            assert_eq!(
                read[1].spec.parameters["properties"]["tags"]["items"]["type"],
                "string"
            );
        }
        assert!(read_catalog("no catalog here").is_empty());
    }

    #[test]
    fn result_headers_are_read() {
        let text = "PTK_RESULT: read_file (call id: call_1)\n{\"a\": 1}\n\nPTK_RESULT: f (call id: c2, error)\nboom";
        assert!(is_results(text));
        assert_eq!(
            result_headers(text).unwrap(),
            [("read_file", "call_1"), ("f", "c2")]
        );
        assert_eq!(result_headers("PTK_RESULT: nope"), Err("PTK_RESULT: nope"));
        assert!(!is_results("hello PTK_RESULT:"));
    }
}
