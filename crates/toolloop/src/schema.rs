//! Sample values built from a JSON Schema: the arguments the offline test model and the mock
//! server send.
//!
//! For each schema: its `default`, else the first of its `examples`, else its `const`, else the
//! first `enum` value, else a placeholder of the right type (`"a"`, `0`, `0.0`, `false`, `[]`,
//! or an object with every property filled in). Local `$ref`s (`#/$defs/…`,
//! `#/definitions/…`) are followed; `anyOf` / `oneOf` take their first branch that is not
//! `null`.

use serde_json::{Map, Value, json};

/// A value that fits `schema`; see the module docs for the rules.
pub fn sample(schema: &Value) -> Value {
    sample_in(schema, schema, 0)
}

fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

fn sample_in(schema: &Value, root: &Value, depth: usize) -> Value {
    let Some(obj) = schema.as_object() else {
        return json!({});
    };
    if depth > 16 {
        return Value::Null;
    }
    if let Some(v) = obj.get("default") {
        return v.clone();
    }
    if let Some(v) = obj
        .get("examples")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        return v.clone();
    }
    if let Some(v) = obj.get("const") {
        return v.clone();
    }
    if let Some(v) = obj
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        return v.clone();
    }
    if let Some(target) = obj
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| resolve(root, r))
    {
        return sample_in(target, root, depth + 1);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = obj.get(key).and_then(Value::as_array) {
            let branch = branches
                .iter()
                .find(|b| b.get("type") != Some(&json!("null")))
                .or_else(|| branches.first());
            if let Some(b) = branch {
                return sample_in(b, root, depth + 1);
            }
        }
    }
    let ty = match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if obj.contains_key("properties") => "object",
        _ => "object",
    };
    match ty {
        "string" => json!("a"),
        "integer" => json!(obj.get("minimum").and_then(Value::as_i64).unwrap_or(0)),
        "number" => json!(obj.get("minimum").and_then(Value::as_f64).unwrap_or(0.0)),
        "boolean" => json!(false),
        "null" => Value::Null,
        "array" => {
            let min = obj.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let items = obj.get("items").cloned().unwrap_or(json!({}));
            Value::Array(
                (0..min)
                    .map(|_| sample_in(&items, root, depth + 1))
                    .collect(),
            )
        }
        _ => {
            let mut out = Map::new();
            if let Some(props) = obj.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    out.insert(k.clone(), sample_in(v, root, depth + 1));
                }
            }
            Value::Object(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_then_examples_then_enum_then_placeholder() {
        let s = json!({
            "type": "object",
            "properties": {
                "a": {"type": "string", "default": "d", "examples": ["e"]},
                "b": {"type": "string", "examples": ["e"], "enum": ["x"]},
                "c": {"type": "string", "enum": ["x", "y"]},
                "d": {"type": "integer"},
                "e": {"type": "number"},
                "f": {"type": "boolean"},
                "g": {"type": "array", "items": {"type": "string"}},
                "h": {"type": ["null", "string"]},
                "i": {"$ref": "#/$defs/Inner"},
                "j": {"anyOf": [{"type": "null"}, {"type": "integer"}]}
            },
            "$defs": {"Inner": {"type": "object", "properties": {"k": {"type": "boolean"}}}}
        });
        assert_eq!(
            sample(&s),
            json!({"a": "d", "b": "e", "c": "x", "d": 0, "e": 0.0, "f": false, "g": [],
                   "h": "a", "i": {"k": false}, "j": 0})
        );
    }

    #[test]
    fn cyclic_refs_terminate() {
        let s = json!({"$ref": "#"});
        assert_eq!(sample(&s), Value::Null);
    }
}
