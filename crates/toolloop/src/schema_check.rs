//! Checking a JSON value against a JSON Schema (tool arguments, final answers).
//!
//! Natively this is the `jsonschema` crate. In WebAssembly (the npm package's module) it is a
//! compact checker of its own, so that the module stays small: the `jsonschema` crate with its
//! regular-expression engines, big numbers and bundled meta-schemas is about half the module.
//! It checks the keywords of JSON Schema's validation vocabulary (`type`, `enum`, `const`, the
//! numeric, string, array and object keywords, `pattern` and `patternProperties` as ECMA-262
//! patterns translated for the `regex` crate as `jsonschema` translates them,
//! `allOf`/`anyOf`/`oneOf`/`not`, `if`/`then`/`else`, `dependentRequired`,
//! `dependentSchemas`, draft 4–7's `dependencies` and tuple `items`) as the draft the root's
//! `$schema` names has them (2020-12 when it names none), and follows references inside the
//! schema (`#`, `#/$defs/…`, `#/definitions/…`). `format` is an annotation, as it is natively
//! for 2019-09 and 2020-12 (natively, draft 4–7 schemas assert it: the one difference left). A
//! schema that uses what it does not check (`unevaluatedProperties`, `unevaluatedItems`,
//! `$dynamicRef`, `$recursiveRef`, a reference to another document or under a nested `$id`, a
//! reference that comes back to itself for the same value, a pattern the `regex` crate does
//! not read) is refused when the tools are set, naming the keyword: never accepted and left
//! unchecked. The tests' `agreement` module checks both accept the same values.

use serde_json::Value;

/// A compiled schema.
pub(crate) struct Checker {
    #[cfg(not(target_arch = "wasm32"))]
    inner: jsonschema::Validator,
    #[cfg(target_arch = "wasm32")]
    inner: lite::Lite,
}

impl Checker {
    /// Compiles `schema`; the error says what is wrong with it.
    pub(crate) fn new(schema: &Value) -> Result<Checker, String> {
        #[cfg(not(target_arch = "wasm32"))]
        let inner = jsonschema::validator_for(schema).map_err(|e| e.to_string())?;
        #[cfg(target_arch = "wasm32")]
        let inner = lite::Lite::new(schema)?;
        Ok(Checker { inner })
    }

    /// What is wrong with `value`, at most `most` problems, each `at `/json/path`: …`; empty
    /// when it is valid.
    pub(crate) fn problems(&self, value: &Value, most: usize) -> Vec<String> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            if self.inner.is_valid(value) {
                return Vec::new();
            }
            self.inner
                .iter_errors(value)
                .take(most)
                .map(|e| at(&e.instance_path().to_string(), &e.to_string()))
                .collect()
        }
        #[cfg(target_arch = "wasm32")]
        {
            self.inner.problems(value, most)
        }
    }
}

/// Whether the WebAssembly build's checker gives `value` the verdict (valid or not) that the
/// native one, the `jsonschema` crate, gives it against `schema`. `Ok` when they agree, when
/// both refuse the schema, or when the WebAssembly checker refuses it by name (a keyword,
/// pattern or reference it does not check); otherwise the error shows the schema, the value
/// and both verdicts (or that the WebAssembly checker reads a schema `jsonschema` refuses).
/// For tests and the `schema_agreement` fuzz target.
#[cfg(all(any(test, feature = "testing"), not(target_arch = "wasm32")))]
pub fn webassembly_checker_agrees(schema: &Value, value: &Value) -> Result<(), String> {
    let native = match jsonschema::validator_for(schema) {
        Ok(native) => native,
        Err(native) => {
            return match lite::Lite::new(schema) {
                Err(_) => Ok(()),
                Ok(_) => Err(format!(
                    "lite reads {schema}, which jsonschema refuses: {native}"
                )),
            };
        }
    };
    let lite = match lite::Lite::new(schema) {
        Ok(lite) => lite,
        Err(e)
            if [
                "WebAssembly build",
                "pattern",
                "reference",
                "nested too deeply",
            ]
            .iter()
            .any(|named| e.contains(named)) =>
        {
            return Ok(());
        }
        Err(e) => return Err(format!("lite refuses {schema} that jsonschema reads: {e}")),
    };
    let native = native.is_valid(value);
    let ours = lite.problems(value, 1);
    if native == ours.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "schema {schema}\nvalue {value}\njsonschema valid: {native}\nlite: {ours:?}"
        ))
    }
}

/// A problem at a JSON path (`/` for the value itself).
fn at(path: &str, message: &str) -> String {
    let path = if path.is_empty() { "/" } else { path };
    format!("at `{path}`: {message}")
}

#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
mod lite {
    use super::at;
    use serde_json::{Map, Value};
    use std::collections::HashMap;

    /// How deep references may lead (a schema that refers to itself with no progress in the
    /// value would otherwise never end).
    const MAX_DEPTH: usize = 128;

    /// A schema checked by this module (see the module's documentation).
    pub(crate) struct Lite {
        root: Value,
        /// The schema's patterns (`pattern`, `patternProperties`' keys), compiled.
        patterns: HashMap<String, regex::Regex>,
        /// The draft its `$schema` names: 4, 6, 7, 2019 (2019-09) or 2020 (2020-12, the
        /// default).
        draft: u16,
    }

    impl Lite {
        pub(crate) fn new(schema: &Value) -> Result<Lite, String> {
            let mut lite = Lite {
                root: schema.clone(),
                patterns: HashMap::new(),
                draft: draft(schema),
            };
            if !schema.is_object() && !schema.is_boolean() {
                return Err(format!(
                    "{schema} is not a JSON Schema (an object or a boolean)"
                ));
            }
            lite.prepare(schema, schema, 0, true)?;
            no_loop_in_place(schema, schema, &mut Vec::new(), &mut HashMap::new())?;
            Ok(lite)
        }

        /// Compiles the patterns of `schema` and its subschemas, and refuses what is not
        /// checked here and what the draft's meta-schema refuses (a keyword's value of the
        /// wrong shape, as `{"required": "a"}`), as `jsonschema` does natively. `known` is
        /// whether `schema` stands where a schema stands; elsewhere (under a keyword the draft
        /// does not have, which a reference may still lead into) only patterns and references
        /// are read.
        fn prepare(
            &mut self,
            root: &Value,
            schema: &Value,
            depth: usize,
            known: bool,
        ) -> Result<(), String> {
            if depth > MAX_DEPTH {
                return Err("the schema is nested too deeply".into());
            }
            let Value::Object(s) = schema else {
                if known && !self.is_schema(schema) {
                    return Err(format!(
                        "{schema} stands where a subschema must (an object{})",
                        if self.draft == 4 { "" } else { " or a boolean" }
                    ));
                }
                return Ok(());
            };
            for keyword in [
                "unevaluatedProperties",
                "unevaluatedItems",
                "$dynamicRef",
                "$recursiveRef",
            ] {
                if s.contains_key(keyword) {
                    return Err(format!(
                        "`{keyword}` is not checked by the WebAssembly build; leave it out of \
                         the schema"
                    ));
                }
            }
            // Below a nested `$id`, `#…` references are resolved from that subschema (a
            // resource of its own); here they are resolved from the root.
            if depth > 0
                && s.get("$id")
                    .and_then(Value::as_str)
                    .is_some_and(|id| !id.starts_with('#'))
                && schema.to_string().contains("\"$ref\"")
            {
                return Err(
                    "`$id` inside the schema, with references under it, is not followed by the \
                     WebAssembly build; leave it out of the schema"
                        .into(),
                );
            }
            if let Some(r) = s.get("$ref").filter(|_| known) {
                let r = r.as_str().ok_or("`$ref` must be a string")?;
                if resolve(root, r).is_none() {
                    return Err(format!(
                        "the reference `{r}` does not lead to a part of this schema (only \
                         references inside the schema are followed)"
                    ));
                }
            }
            if let Some(p) = s.get("pattern").and_then(Value::as_str) {
                self.compile(p)?;
            }
            if let Some(Value::Object(props)) = s.get("patternProperties") {
                for p in props.keys() {
                    self.compile(p)?;
                }
            }
            if known && self.draft == 4 {
                // Draft 4's meta-schema: a boolean `exclusiveMinimum` goes with `minimum`.
                for (exclusive, bound) in [
                    ("exclusiveMinimum", "minimum"),
                    ("exclusiveMaximum", "maximum"),
                ] {
                    if s.contains_key(exclusive) && !s.contains_key(bound) {
                        return Err(format!("`{exclusive}` needs `{bound}` beside it"));
                    }
                }
            }
            for (keyword, sub) in s {
                let shape = if known {
                    shape(keyword, self.draft)
                } else {
                    None
                };
                let Some(shape) = shape else {
                    // Not a keyword here: a reference may still lead into it.
                    match sub {
                        Value::Object(_) => self.prepare(root, sub, depth + 1, false)?,
                        Value::Array(items) => {
                            for item in items {
                                self.prepare(root, item, depth + 1, false)?;
                            }
                        }
                        _ => {}
                    }
                    continue;
                };
                let wrong = |what: &str| format!("`{keyword}` must be {what}, not {sub}");
                match shape {
                    Shape::Schema => self.prepare(root, sub, depth + 1, true)?,
                    Shape::SchemaOrFalse if self.draft == 4 && sub.is_boolean() => {}
                    Shape::SchemaOrFalse => self.prepare(root, sub, depth + 1, true)?,
                    Shape::Schemas | Shape::SchemaOrSchemas => match sub {
                        Value::Array(items) if !items.is_empty() => {
                            for item in items {
                                self.prepare(root, item, depth + 1, true)?;
                            }
                        }
                        _ if shape == Shape::SchemaOrSchemas && self.is_schema(sub) => {
                            self.prepare(root, sub, depth + 1, true)?;
                        }
                        _ if shape == Shape::SchemaOrSchemas => {
                            return Err(wrong("a schema or a non-empty array of schemas"));
                        }
                        _ => return Err(wrong("a non-empty array of schemas")),
                    },
                    Shape::SchemaMap | Shape::Dependencies => {
                        let Value::Object(map) = sub else {
                            return Err(wrong("an object"));
                        };
                        for item in map.values() {
                            if shape == Shape::Dependencies && item.is_array() {
                                self.names(item).map_err(|what| wrong(&what))?;
                            } else {
                                self.prepare(root, item, depth + 1, true)?;
                            }
                        }
                    }
                    Shape::NamesMap => {
                        let Value::Object(map) = sub else {
                            return Err(wrong("an object"));
                        };
                        for item in map.values() {
                            self.names(item).map_err(|what| wrong(&what))?;
                        }
                    }
                    Shape::Names => self.names(sub).map_err(|what| wrong(&what))?,
                    Shape::Type => {
                        let simple = |t: &Value| t.as_str().is_some_and(|t| TYPES.contains(&t));
                        let ok = match sub {
                            Value::Array(ts) => {
                                !ts.is_empty() && ts.iter().all(simple) && distinct(ts)
                            }
                            t => simple(t),
                        };
                        if !ok {
                            return Err(wrong(
                                "a type name or a non-empty array of distinct ones (`null`, \
                                 `boolean`, `object`, `array`, `number`, `integer`, `string`)",
                            ));
                        }
                    }
                    Shape::Number if !sub.is_number() => return Err(wrong("a number")),
                    Shape::Positive if !sub.as_f64().is_some_and(|n| n > 0.0) => {
                        return Err(wrong("a number greater than 0"));
                    }
                    Shape::Count
                        if !(self.is_type(sub, "integer")
                            && sub.as_f64().is_some_and(|n| n >= 0.0)) =>
                    {
                        return Err(wrong("a whole number, 0 or more"));
                    }
                    Shape::Bool if !sub.is_boolean() => return Err(wrong("true or false")),
                    Shape::Text if !sub.is_string() => return Err(wrong("a string")),
                    Shape::Array if !sub.is_array() => return Err(wrong("an array")),
                    Shape::Number
                    | Shape::Positive
                    | Shape::Count
                    | Shape::Bool
                    | Shape::Text
                    | Shape::Array
                    | Shape::Any => {}
                }
            }
            Ok(())
        }

        /// Whether `schema` may stand where a subschema does (draft 4 has no boolean schemas).
        fn is_schema(&self, schema: &Value) -> bool {
            schema.is_object() || (schema.is_boolean() && self.draft > 4)
        }

        /// Refuses what is not an array of distinct property names (in draft 4, a non-empty
        /// one); the error says what it must be.
        fn names(&self, names: &Value) -> Result<(), String> {
            let ok = match names {
                Value::Array(names) => {
                    names.iter().all(Value::is_string)
                        && distinct(names)
                        && (self.draft > 4 || !names.is_empty())
                }
                _ => false,
            };
            if ok {
                Ok(())
            } else if self.draft == 4 {
                Err("a non-empty array of distinct strings".into())
            } else {
                Err("an array of distinct strings".into())
            }
        }

        /// `keyword` of the schema `s`, if the draft has it and it applies (up to draft 7,
        /// `$ref` hides the keywords beside it).
        fn get<'a>(&self, s: &'a Map<String, Value>, keyword: &str) -> Option<&'a Value> {
            let since = match keyword {
                "const" | "contains" | "propertyNames" => 6,
                "if" => 7,
                "dependentRequired" | "dependentSchemas" | "minContains" | "maxContains" => 2019,
                "prefixItems" => 2020,
                _ => 0,
            };
            if self.draft < since
                || (self.draft <= 7 && keyword != "$ref" && s.contains_key("$ref"))
            {
                return None;
            }
            s.get(keyword)
        }

        fn compile(&mut self, pattern: &str) -> Result<(), String> {
            if !self.patterns.contains_key(pattern) {
                // ECMA-262, as JSON Schema reads patterns (`\d` and `\w` are ASCII there),
                // translated for `regex` the way `jsonschema` translates it natively.
                let translated = jsonschema_regex::to_rust_regex(pattern).map_err(|()| {
                    format!("the pattern `{pattern}` is not a regular expression read here")
                })?;
                let re = regex::Regex::new(&translated)
                    .map_err(|e| format!("the pattern `{pattern}` is not read here: {e}"))?;
                self.patterns.insert(pattern.to_string(), re);
            }
            Ok(())
        }

        pub(crate) fn problems(&self, value: &Value, most: usize) -> Vec<String> {
            let mut out = Vec::new();
            let mut path = String::new();
            self.check(&self.root, value, &mut path, &mut out, most, 0);
            out
        }

        fn is_valid(&self, schema: &Value, value: &Value, depth: usize) -> bool {
            let mut out = Vec::new();
            self.check(schema, value, &mut String::new(), &mut out, 1, depth);
            out.is_empty()
        }

        /// Adds the problems of `value` against `schema` to `out`, up to `most`.
        #[allow(clippy::too_many_lines)]
        fn check(
            &self,
            schema: &Value,
            value: &Value,
            path: &mut String,
            out: &mut Vec<String>,
            most: usize,
            depth: usize,
        ) {
            if out.len() >= most {
                return;
            }
            let s = match schema {
                Value::Bool(true) => return,
                Value::Bool(false) => {
                    out.push(at(path, "False schema does not allow any value"));
                    return;
                }
                Value::Object(s) => s,
                _ => return,
            };
            if depth > MAX_DEPTH {
                out.push(at(path, "the schema's references lead too deep"));
                return;
            }
            if let Some(r) = self.get(s, "$ref").and_then(Value::as_str)
                && let Some(target) = resolve(&self.root, r)
            {
                self.check(target, value, path, out, most, depth + 1);
            }
            if let Some(t) = self.get(s, "type") {
                let fits = match t {
                    Value::String(t) => self.is_type(value, t),
                    Value::Array(ts) => ts
                        .iter()
                        .filter_map(Value::as_str)
                        .any(|t| self.is_type(value, t)),
                    _ => true,
                };
                if !fits {
                    push(out, most, path, format!("{value} is not of type {t}"));
                }
            }
            if let Some(Value::Array(options)) = self.get(s, "enum")
                && !options.iter().any(|o| same(o, value))
            {
                push(
                    out,
                    most,
                    path,
                    format!("{value} is not one of {}", Value::Array(options.clone())),
                );
            }
            if let Some(c) = self.get(s, "const")
                && !same(c, value)
            {
                push(out, most, path, format!("{c} was expected"));
            }
            match value {
                Value::Number(n) => {
                    use std::cmp::Ordering::{Greater, Less};
                    let num = |k: &str| self.get(s, k).and_then(Value::as_number);
                    let draft4_exclusive =
                        |k: &str| self.get(s, k).and_then(Value::as_bool) == Some(true);
                    if let Some(m) = num("minimum") {
                        if draft4_exclusive("exclusiveMinimum") && order(n, m) != Greater {
                            push(
                                out,
                                most,
                                path,
                                format!("{value} is less than or equal to the minimum of {m}"),
                            );
                        } else if order(n, m) == Less {
                            push(
                                out,
                                most,
                                path,
                                format!("{value} is less than the minimum of {m}"),
                            );
                        }
                    }
                    if let Some(m) = num("maximum") {
                        if draft4_exclusive("exclusiveMaximum") && order(n, m) != Less {
                            push(
                                out,
                                most,
                                path,
                                format!("{value} is greater than or equal to the maximum of {m}"),
                            );
                        } else if order(n, m) == Greater {
                            push(
                                out,
                                most,
                                path,
                                format!("{value} is greater than the maximum of {m}"),
                            );
                        }
                    }
                    if let Some(m) = num("exclusiveMinimum")
                        && order(n, m) != Greater
                    {
                        push(
                            out,
                            most,
                            path,
                            format!("{value} is less than or equal to the minimum of {m}"),
                        );
                    }
                    if let Some(m) = num("exclusiveMaximum")
                        && order(n, m) != Less
                    {
                        push(
                            out,
                            most,
                            path,
                            format!("{value} is greater than or equal to the maximum of {m}"),
                        );
                    }
                    if let Some(m) = num("multipleOf")
                        .and_then(serde_json::Number::as_f64)
                        .filter(|m| *m > 0.0)
                        && !is_multiple_of(n, m)
                    {
                        push(out, most, path, format!("{value} is not a multiple of {m}"));
                    }
                }
                Value::String(text) => {
                    let len = || text.chars().count() as u64;
                    if let Some(m) = self.get(s, "minLength").and_then(count)
                        && len() < m
                    {
                        push(
                            out,
                            most,
                            path,
                            format!("{value} is shorter than {m} characters"),
                        );
                    }
                    if let Some(m) = self.get(s, "maxLength").and_then(count)
                        && len() > m
                    {
                        push(
                            out,
                            most,
                            path,
                            format!("{value} is longer than {m} characters"),
                        );
                    }
                    if let Some(p) = self.get(s, "pattern").and_then(Value::as_str)
                        && let Some(re) = self.patterns.get(p)
                        && !re.is_match(text)
                    {
                        push(out, most, path, format!("{value} does not match \"{p}\""));
                    }
                }
                Value::Array(items) => {
                    let n = items.len() as u64;
                    if let Some(m) = self.get(s, "minItems").and_then(count)
                        && n < m
                    {
                        push(out, most, path, format!("{value} has less than {m} items"));
                    }
                    if let Some(m) = self.get(s, "maxItems").and_then(count)
                        && n > m
                    {
                        push(out, most, path, format!("{value} has more than {m} items"));
                    }
                    if self.get(s, "uniqueItems").and_then(Value::as_bool) == Some(true)
                        && items
                            .iter()
                            .enumerate()
                            .any(|(i, a)| items[i + 1..].iter().any(|b| same(a, b)))
                    {
                        push(out, most, path, format!("{value} has non-unique elements"));
                    }
                    // The schemas of the first items (`prefixItems`, or draft 4–7's `items`
                    // array), then of the rest (`items`, or `additionalItems` after an array).
                    let (prefix, rest) = match (self.get(s, "prefixItems"), self.get(s, "items")) {
                        (Some(Value::Array(p)), rest) => (p.as_slice(), rest),
                        (_, Some(Value::Array(p))) => {
                            (p.as_slice(), self.get(s, "additionalItems"))
                        }
                        (_, rest) => (&[][..], rest),
                    };
                    for (i, item) in items.iter().enumerate() {
                        let sub = prefix
                            .get(i)
                            .or(if i >= prefix.len() { rest } else { None });
                        if let Some(sub) = sub {
                            self.child(sub, item, &i.to_string(), path, out, most, depth);
                        }
                    }
                    if let Some(c) = self.get(s, "contains") {
                        let found = items
                            .iter()
                            .filter(|i| self.is_valid(c, i, depth + 1))
                            .count() as u64;
                        let least = self.get(s, "minContains").and_then(count).unwrap_or(1);
                        if found < least {
                            push(
                                out,
                                most,
                                path,
                                format!("None of {value} are valid under the given schema"),
                            );
                        }
                        if let Some(m) = self.get(s, "maxContains").and_then(count)
                            && found > m
                        {
                            push(
                                out,
                                most,
                                path,
                                format!("{value} has more than {m} matching items"),
                            );
                        }
                    }
                }
                Value::Object(obj) => {
                    self.check_object(s, obj, value, path, out, most, depth);
                }
                _ => {}
            }
            if let Some(Value::Array(all)) = self.get(s, "allOf") {
                for sub in all {
                    self.check(sub, value, path, out, most, depth + 1);
                }
            }
            if let Some(Value::Array(any)) = self.get(s, "anyOf")
                && !any.iter().any(|sub| self.is_valid(sub, value, depth + 1))
            {
                push(
                    out,
                    most,
                    path,
                    format!(
                        "{value} is not valid under any of the schemas listed in the 'anyOf' keyword"
                    ),
                );
            }
            if let Some(Value::Array(one)) = self.get(s, "oneOf") {
                match one
                    .iter()
                    .filter(|sub| self.is_valid(sub, value, depth + 1))
                    .count()
                {
                    1 => {}
                    0 => push(
                        out,
                        most,
                        path,
                        format!(
                            "{value} is not valid under any of the schemas listed in the 'oneOf' keyword"
                        ),
                    ),
                    _ => push(
                        out,
                        most,
                        path,
                        format!(
                            "{value} is valid under more than one of the schemas listed in the 'oneOf' keyword"
                        ),
                    ),
                }
            }
            if let Some(not) = self.get(s, "not")
                && self.is_valid(not, value, depth + 1)
            {
                push(
                    out,
                    most,
                    path,
                    format!("{value} should not be valid under {not}"),
                );
            }
            if let Some(cond) = self.get(s, "if") {
                let branch = if self.is_valid(cond, value, depth + 1) {
                    self.get(s, "then")
                } else {
                    self.get(s, "else")
                };
                if let Some(branch) = branch {
                    self.check(branch, value, path, out, most, depth + 1);
                }
            }
        }

        #[allow(clippy::too_many_arguments)]
        fn check_object(
            &self,
            s: &Map<String, Value>,
            obj: &Map<String, Value>,
            value: &Value,
            path: &mut String,
            out: &mut Vec<String>,
            most: usize,
            depth: usize,
        ) {
            let fail = |out: &mut Vec<String>, path: &str, message: String| {
                if out.len() < most {
                    out.push(at(path, &message));
                }
            };
            let n = obj.len() as u64;
            if let Some(m) = self.get(s, "minProperties").and_then(count)
                && n < m
            {
                fail(out, path, format!("{value} has less than {m} properties"));
            }
            if let Some(m) = self.get(s, "maxProperties").and_then(count)
                && n > m
            {
                fail(out, path, format!("{value} has more than {m} properties"));
            }
            let required = |out: &mut Vec<String>, path: &str, names: &[Value]| {
                for name in names.iter().filter_map(Value::as_str) {
                    if !obj.contains_key(name) {
                        fail(out, path, format!("\"{name}\" is a required property"));
                    }
                }
            };
            if let Some(Value::Array(names)) = self.get(s, "required") {
                required(out, path, names);
            }
            for key in ["dependentRequired", "dependencies"] {
                if let Some(Value::Object(deps)) = self.get(s, key) {
                    for (name, dep) in deps {
                        if obj.contains_key(name) {
                            match dep {
                                Value::Array(names) => required(out, path, names),
                                schema => self.check(schema, value, path, out, most, depth + 1),
                            }
                        }
                    }
                }
            }
            if let Some(Value::Object(deps)) = self.get(s, "dependentSchemas") {
                for (name, schema) in deps {
                    if obj.contains_key(name) {
                        self.check(schema, value, path, out, most, depth + 1);
                    }
                }
            }
            let props = self.get(s, "properties").and_then(Value::as_object);
            let patterns = self.get(s, "patternProperties").and_then(Value::as_object);
            let additional = self.get(s, "additionalProperties");
            let names = self.get(s, "propertyNames");
            let mut unexpected = Vec::new();
            for (key, item) in obj {
                if let Some(names) = names
                    && !self.is_valid(names, &Value::String(key.clone()), depth + 1)
                {
                    fail(out, path, format!("\"{key}\" is not a valid property name"));
                }
                let mut matched = false;
                if let Some(sub) = props.and_then(|p| p.get(key)) {
                    matched = true;
                    self.child(sub, item, key, path, out, most, depth);
                }
                for (p, sub) in patterns.into_iter().flatten() {
                    if self.patterns.get(p).is_some_and(|re| re.is_match(key)) {
                        matched = true;
                        self.child(sub, item, key, path, out, most, depth);
                    }
                }
                match additional {
                    Some(Value::Bool(false)) if !matched => unexpected.push(key.as_str()),
                    Some(sub @ Value::Object(_)) if !matched => {
                        self.child(sub, item, key, path, out, most, depth);
                    }
                    _ => {}
                }
            }
            if !unexpected.is_empty() {
                let list: Vec<String> = unexpected.iter().map(|k| format!("'{k}'")).collect();
                let verb = if list.len() == 1 { "was" } else { "were" };
                fail(
                    out,
                    path,
                    format!(
                        "Additional properties are not allowed ({} {verb} unexpected)",
                        list.join(", ")
                    ),
                );
            }
        }

        /// Checks `value`, found at `key` of the value at `path`, against `schema`.
        #[allow(clippy::too_many_arguments)]
        fn child(
            &self,
            schema: &Value,
            value: &Value,
            key: &str,
            path: &mut String,
            out: &mut Vec<String>,
            most: usize,
            depth: usize,
        ) {
            let len = path.len();
            path.push('/');
            path.push_str(&key.replace('~', "~0").replace('/', "~1"));
            self.check(schema, value, path, out, most, depth + 1);
            path.truncate(len);
        }
    }

    /// Refuses a schema that, through `$ref`, comes back to itself for the same value (as
    /// `{"$ref": "#"}` does): `jsonschema` takes such a loop as no constraint; this module
    /// would follow it to its depth limit. `chain` is the subschemas walked for the same value
    /// down to `schema`; `state` marks those being walked (`false`) and walked (`true`).
    fn no_loop_in_place(
        root: &Value,
        schema: &Value,
        chain: &mut Vec<*const Value>,
        state: &mut HashMap<*const Value, bool>,
    ) -> Result<(), String> {
        let Value::Object(s) = schema else {
            return Ok(());
        };
        let here = std::ptr::from_ref(schema);
        if chain.contains(&here) {
            return Err(
                "the schema refers back to itself (`$ref`) for the same value, which the \
                 WebAssembly build does not check; leave that reference out of the schema"
                    .into(),
            );
        }
        if state.contains_key(&here) || chain.len() > MAX_DEPTH {
            return Ok(());
        }
        state.insert(here, false);
        // The subschemas that apply to the same value.
        let mut same: Vec<&Value> = Vec::new();
        if let Some(target) = s
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| resolve(root, r))
        {
            same.push(target);
        }
        for k in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(list)) = s.get(k) {
                same.extend(list);
            }
        }
        for k in ["not", "if", "then", "else"] {
            same.extend(s.get(k));
        }
        for k in ["dependentSchemas", "dependencies"] {
            if let Some(Value::Object(deps)) = s.get(k) {
                same.extend(deps.values());
            }
        }
        chain.push(here);
        for sub in same {
            no_loop_in_place(root, sub, chain, state)?;
        }
        chain.pop();
        // The other subschemas apply to parts of the value: a chain of their own.
        for (k, sub) in s {
            match (k.as_str(), sub) {
                ("enum" | "const" | "default" | "examples" | "required" | "type", _) => {}
                (_, Value::Object(_)) => no_loop_in_place(root, sub, &mut Vec::new(), state)?,
                (_, Value::Array(items)) => {
                    for item in items {
                        no_loop_in_place(root, item, &mut Vec::new(), state)?;
                    }
                }
                _ => {}
            }
        }
        state.insert(here, true);
        Ok(())
    }

    /// What a keyword's value must be, as the draft's meta-schema has it.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Shape {
        /// A subschema (an object, or from draft 6 a boolean).
        Schema,
        /// A subschema, or in draft 4 a boolean (`additionalProperties`, `additionalItems`).
        SchemaOrFalse,
        /// A non-empty array of subschemas.
        Schemas,
        /// A subschema or a non-empty array of them (`items` up to 2019-09).
        SchemaOrSchemas,
        /// An object of subschemas.
        SchemaMap,
        /// An object of subschemas or arrays of property names (`dependencies`).
        Dependencies,
        /// An object of arrays of property names (`dependentRequired`).
        NamesMap,
        /// An array of distinct property names (`required`).
        Names,
        /// A type name or a non-empty array of distinct ones.
        Type,
        Number,
        /// A number above 0 (`multipleOf`).
        Positive,
        /// A whole number, 0 or more.
        Count,
        Bool,
        Text,
        Array,
        Any,
    }

    /// The type names of JSON Schema.
    const TYPES: [&str; 7] = [
        "null", "boolean", "object", "array", "number", "integer", "string",
    ];

    /// What `keyword`'s value must be in `draft` (4, 6, 7, 2019 or 2020); `None` for what the
    /// draft does not have.
    fn shape(keyword: &str, draft: u16) -> Option<Shape> {
        use Shape::{
            Any, Array, Bool, Count, Dependencies, Names, NamesMap, Number, Positive, Schema,
            SchemaMap, SchemaOrFalse, SchemaOrSchemas, Schemas, Text, Type,
        };
        let (since, shape) = match keyword {
            "$schema" | "title" | "description" | "format" => (4, Text),
            "id" if draft == 4 => (4, Text),
            "default" | "enum" => (4, if keyword == "enum" { Array } else { Any }),
            "type" => (4, Type),
            "multipleOf" => (4, Positive),
            "minimum" | "maximum" => (4, Number),
            "exclusiveMinimum" | "exclusiveMaximum" => (4, if draft == 4 { Bool } else { Number }),
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties"
            | "maxProperties" => (4, Count),
            "pattern" => (4, Text),
            "uniqueItems" => (4, Bool),
            "required" => (4, Names),
            "items" if draft < 2020 => (4, SchemaOrSchemas),
            "items" => (4, Schema),
            "additionalItems" if draft < 2020 => (4, SchemaOrFalse),
            "additionalProperties" => (4, SchemaOrFalse),
            "not" => (4, Schema),
            "allOf" | "anyOf" | "oneOf" => (4, Schemas),
            "properties" | "patternProperties" | "definitions" => (4, SchemaMap),
            "dependencies" => (4, Dependencies),
            "$id" | "$ref" => (6, Text),
            "const" => (6, Any),
            "examples" => (6, Array),
            "contains" | "propertyNames" => (6, Schema),
            "$comment" | "contentMediaType" | "contentEncoding" => (7, Text),
            "readOnly" | "writeOnly" => (7, Bool),
            "if" | "then" | "else" => (7, Schema),
            "$anchor" => (2019, Text),
            "deprecated" => (2019, Bool),
            "$defs" | "dependentSchemas" => (2019, SchemaMap),
            "dependentRequired" => (2019, NamesMap),
            "minContains" | "maxContains" => (2019, Count),
            "contentSchema" => (2019, Schema),
            "prefixItems" => (2020, Schemas),
            _ => return None,
        };
        (draft >= since).then_some(shape)
    }

    /// Whether no two of `items` are the same JSON value.
    fn distinct(items: &[Value]) -> bool {
        items
            .iter()
            .enumerate()
            .all(|(i, a)| items[i + 1..].iter().all(|b| !same(a, b)))
    }

    /// Adds a problem at `path`, unless `out` holds `most` already.
    fn push(out: &mut Vec<String>, most: usize, path: &str, message: String) {
        if out.len() < most {
            out.push(at(path, &message));
        }
    }

    impl Lite {
        /// Whether `value` is of the JSON Schema type `t` (in draft 4, `1.0` is no integer).
        fn is_type(&self, value: &Value, t: &str) -> bool {
            if self.draft == 4 && t == "integer" {
                // As `jsonschema` reads it: written without a fraction or an exponent (an
                // exponent past 2^63 writes a whole number anyway).
                return value.as_number().is_some_and(|n| {
                    let text = n.to_string();
                    n.is_i64()
                        || n.is_u64()
                        || if text.contains(['e', 'E']) {
                            n.as_f64()
                                .is_some_and(|x| x.abs() >= 9_223_372_036_854_775_808.0)
                        } else {
                            !text.contains('.')
                        }
                });
            }
            is_type(value, t)
        }
    }

    /// The draft the root's `$schema` names (2020-12 when it names none).
    fn draft(root: &Value) -> u16 {
        let named = root.get("$schema").and_then(Value::as_str).unwrap_or("");
        if named.contains("draft-04") {
            4
        } else if named.contains("draft-06") {
            6
        } else if named.contains("draft-07") {
            7
        } else if named.contains("2019-09") {
            2019
        } else {
            2020
        }
    }

    /// How `a` compares with `b`, exactly (integers past 2^53 included).
    fn order(a: &serde_json::Number, b: &serde_json::Number) -> std::cmp::Ordering {
        let int = |n: &serde_json::Number| {
            n.as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
        };
        match (int(a), int(b)) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(x), None) => int_to_float(x, b.as_f64().unwrap_or(f64::NAN)),
            (None, Some(y)) => int_to_float(y, a.as_f64().unwrap_or(f64::NAN)).reverse(),
            (None, None) => {
                let (x, y) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
                x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal)
            }
        }
    }

    /// How the integer `x` compares with the finite float `y`, exactly.
    fn int_to_float(x: i128, y: f64) -> std::cmp::Ordering {
        use std::cmp::Ordering::{Greater, Less};
        if y >= 1.7e38 {
            return Less;
        }
        if y <= -1.7e38 {
            return Greater;
        }
        let whole = y.floor();
        // `whole` is an integer within `i128`: the conversion is exact.
        match x.cmp(&(whole as i128)) {
            std::cmp::Ordering::Equal if y > whole => Less,
            o => o,
        }
    }

    /// A count (`minLength`, `maxItems`, …): a whole number, `2.0` included.
    fn count(v: &Value) -> Option<u64> {
        v.as_u64().or_else(|| {
            v.as_f64()
                .filter(|x| *x >= 0.0 && x.fract() == 0.0 && *x < 1.8e19)
                .map(|x| x as u64)
        })
    }

    /// Whether `value` is of the JSON Schema type `t`.
    fn is_type(value: &Value, t: &str) -> bool {
        match t {
            "null" => value.is_null(),
            "boolean" => value.is_boolean(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "number" => value.is_number(),
            "integer" => value
                .as_f64()
                .is_some_and(|x| x.is_finite() && x.fract() == 0.0),
            _ => false,
        }
    }

    /// Whether `n` is a multiple of `m` (positive), as `jsonschema` reads it: exactly for
    /// integers, and for a fractional `m` in the decimals both numbers print as (`0.3` is a
    /// multiple of `0.1`, though not in binary).
    fn is_multiple_of(n: &serde_json::Number, m: f64) -> bool {
        if m.fract() == 0.0 {
            if m <= 9_007_199_254_740_992.0 {
                // `m` is a whole number of at most 2^53: exact.
                if let Some(v) = n.as_u64() {
                    return v % (m as u64) == 0;
                }
                if let Some(v) = n.as_i64() {
                    return v % (m as i64) == 0;
                }
            }
            let x = n.as_f64().unwrap_or(f64::NAN);
            return x.fract() == 0.0 && x % m == 0.0;
        }
        let x = n.as_f64().unwrap_or(f64::NAN);
        if x == 0.0 {
            return true;
        }
        if x.is_nan() || x.abs() < m {
            return false;
        }
        let (Some((xm, xd)), Some((mm, md))) = (decimal(x), decimal(m)) else {
            return false;
        };
        // x / m = (xm · 10^md) / (mm · 10^xd); cancel the shared power of ten first.
        let shared = xd.min(md);
        let scale = |mantissa: i128, decimals: i32| {
            let places = u32::try_from(decimals - shared).ok()?;
            mantissa.checked_mul(10_i128.checked_pow(places)?)
        };
        match (scale(xm, md), scale(mm, xd)) {
            (Some(a), Some(b)) if b != 0 => a % b == 0,
            // Past `i128`, `jsonschema` reads a whole `x` as the integer it is in binary,
            // x = a·2^p, and `m` as its decimal mm / 10^md: x / m is whole when mm divides
            // a · 2^p · 10^md. Otherwise, in the decimals: mm divides xm · 10^(md - xd).
            _ => {
                let mm = mm.unsigned_abs();
                let pow = |base: u128, times: i32| {
                    (0..times.max(0)).fold(1 % mm, |acc, _| acc * base % mm)
                };
                if x.fract() == 0.0 {
                    let (a, p) = odd_parts(x);
                    u128::from(a) % mm * pow(2, p) % mm * pow(10, md) % mm == 0
                } else {
                    xm.unsigned_abs() % mm * pow(10, md - xd) % mm == 0
                }
            }
        }
    }

    /// A finite, non-zero `f64` as `a · 2^p` with `a` odd (sign dropped).
    fn odd_parts(x: f64) -> (u64, i32) {
        let bits = x.abs().to_bits();
        let exponent = i32::try_from((bits >> 52) & 0x7ff).unwrap_or(0);
        let fraction = bits & ((1 << 52) - 1);
        let (mut a, mut p) = if exponent == 0 {
            (fraction, -1074)
        } else {
            (fraction | (1 << 52), exponent - 1075)
        };
        while a != 0 && a % 2 == 0 {
            a /= 2;
            p += 1;
        }
        (a.max(1), p)
    }

    /// A finite `f64` as the shortest decimal that reads back as it: `mantissa / 10^decimals`.
    fn decimal(x: f64) -> Option<(i128, i32)> {
        let text = format!("{x:e}");
        let (digits, exponent) = text.split_once('e')?;
        let exponent: i32 = exponent.parse().ok()?;
        let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
        let mantissa: i128 = format!("{whole}{fraction}").parse().ok()?;
        Some((mantissa, i32::try_from(fraction.len()).ok()? - exponent))
    }

    /// JSON equality, with numbers equal by value (`1` and `1.0`).
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => order(x, y) == std::cmp::Ordering::Equal,
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| same(a, b)))
            }
            _ => a == b,
        }
    }

    /// The part of `root` a reference inside it names (`#`, `#/…` as a JSON pointer, with
    /// percent-encoded characters).
    fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
        let pointer = reference.strip_prefix('#')?;
        if pointer.contains('%') {
            let decoded = percent_decode(pointer)?;
            return root.pointer(&decoded);
        }
        root.pointer(pointer)
    }

    fn percent_decode(s: &str) -> Option<String> {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).ok()
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use serde_json::json;

        fn problems(schema: Value, value: Value) -> Vec<String> {
            Lite::new(&schema).unwrap().problems(&value, 10)
        }

        #[test]
        fn the_keywords_tool_arguments_use_are_checked() {
            let schema = json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 2, "pattern": "^[A-Z]"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "unit": {"enum": ["c", "f"]},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "uniqueItems": true},
                    "at": {"$ref": "#/$defs/point"}
                },
                "required": ["city"],
                "additionalProperties": false,
                "$defs": {"point": {"type": "object", "required": ["x"], "properties": {"x": {"type": "number"}}}}
            });
            assert!(problems(schema.clone(), json!({"city": "Paris", "days": 3, "unit": "c", "tags": ["a"], "at": {"x": 1.5}})).is_empty());
            let p = problems(
                schema,
                json!({"city": "p", "days": 9.5, "unit": "k", "tags": ["a", "a", "b"], "at": {}, "extra": 1}),
            );
            let all = p.join("\n");
            for expected in [
                "at `/city`: \"p\" is shorter than 2 characters",
                "at `/city`: \"p\" does not match \"^[A-Z]\"",
                "at `/days`: 9.5 is not of type \"integer\"",
                "at `/days`: 9.5 is greater than the maximum of 7",
                "at `/unit`: \"k\" is not one of [\"c\",\"f\"]",
                "at `/tags`: [\"a\",\"a\",\"b\"] has more than 2 items",
                "at `/tags`: [\"a\",\"a\",\"b\"] has non-unique elements",
                "at `/at`: \"x\" is a required property",
                "at `/`: Additional properties are not allowed ('extra' was unexpected)",
            ] {
                assert!(all.contains(expected), "{expected} not in:\n{all}");
            }
            assert_eq!(p.len(), 9, "{all}");
        }

        #[test]
        fn combinators_conditions_and_numbers() {
            let s = json!({"anyOf": [{"type": "string"}, {"type": "integer", "multipleOf": 0.5}]});
            assert!(problems(s.clone(), json!("a")).is_empty());
            assert!(problems(s.clone(), json!(2)).is_empty());
            assert_eq!(problems(s, json!(true)).len(), 1);
            let s = json!({"oneOf": [{"minimum": 0}, {"maximum": 10}]});
            assert!(problems(s.clone(), json!(-1)).is_empty());
            assert!(problems(s, json!(5))[0].contains("more than one"));
            let s = json!({"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["a"]}, "else": {"required": ["b"]}});
            assert!(problems(s.clone(), json!({"kind": "a", "a": 1})).is_empty());
            assert!(problems(s, json!({"kind": "z"}))[0].contains("\"b\" is a required property"));
            assert!(problems(json!({"not": {"type": "null"}}), json!(null)).len() == 1);
            assert!(problems(json!({"exclusiveMinimum": 1}), json!(1)).len() == 1);
            let draft4 = "http://json-schema.org/draft-04/schema#";
            assert!(
                problems(
                    json!({"$schema": draft4, "minimum": 1, "exclusiveMinimum": true}),
                    json!(1)
                )
                .len()
                    == 1
            );
            assert!(problems(json!({"const": 1}), json!(1.0)).is_empty());
            assert!(problems(json!({"type": "integer"}), json!(3.0)).is_empty());
            assert!(problems(json!(false), json!(1)).len() == 1);
        }

        #[test]
        fn recursive_references_end() {
            let s = json!({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"});
            assert!(problems(s.clone(), json!({"next": {"next": {}}})).is_empty());
            assert_eq!(problems(s, json!({"next": {"next": 1}})).len(), 1);
            // A reference to itself through a value nested deeper than the depth limit: it
            // ends, with a problem.
            let mut deep = json!(1);
            for _ in 0..200 {
                deep = json!({ "next": deep });
            }
            let s = json!({"$defs": {"node": {"properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"});
            assert_eq!(problems(s, deep).len(), 1);
        }

        #[test]
        fn what_is_not_checked_is_refused_by_name() {
            for (schema, words) in [
                (
                    json!({"unevaluatedProperties": false}),
                    "unevaluatedProperties",
                ),
                (
                    json!({"properties": {"a": {"$ref": "https://example.com/s.json"}}}),
                    "https://example.com/s.json",
                ),
                (json!({"pattern": "(?=a)"}), "(?=a)"),
                (json!({"type": 3}), "`type`"),
                // `jsonschema` takes a loop that never goes into the value as no constraint.
                (json!({"$ref": "#"}), "refers back to itself"),
                (
                    json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "properties": {"x": {"$ref": "#/$defs/a"}}}),
                    "refers back to itself",
                ),
                // References under a nested `$id` resolve from it, not from the root.
                (
                    json!({"$defs": {"s": {"$id": "http://x.test/sub", "$ref": "#/$defs/t", "$defs": {"t": {}}}}}),
                    "`$id`",
                ),
                (json!(3), "not a JSON Schema"),
            ] {
                let e = Lite::new(&schema).err().expect("refused");
                assert!(e.contains(words), "{e}");
            }
        }
    }

    /// `Lite` against the `jsonschema` crate: on every schema both read, they accept the same
    /// values.
    #[cfg(all(test, not(target_arch = "wasm32")))]
    mod agreement {
        use super::*;
        use proptest::prelude::*;
        use serde_json::json;

        use crate::schema_check::webassembly_checker_agrees as agree;

        /// Property names the schemas below use, so that generated objects meet them.
        const KEYS: [&str; 6] = ["a", "b", "c", "kind", "x1", "é"];
        /// Patterns both checkers read (the ASCII classes `\d` and `\w` included).
        const PATTERNS: [&str; 7] = ["^a", "^[a-c]+$", r"\d", r"^\w+$", "x[0-9]$", "^$", "é"];

        /// Numbers at the boundaries the schemas below use, and hard ones for floats.
        fn number() -> impl Strategy<Value = Value> {
            prop_oneof![
                prop::sample::select(vec![
                    json!(0),
                    json!(-0.0),
                    json!(1),
                    json!(1.0),
                    json!(-1),
                    json!(2),
                    json!(2.5),
                    json!(3),
                    json!(0.1),
                    json!(0.3),
                    json!(0.30000000000000004),
                    json!(0.5),
                    json!(7),
                    json!(10),
                    json!(1e300),
                    json!(1e-300),
                    json!(u64::MAX),
                    json!(i64::MIN),
                    json!(9_007_199_254_740_993_u64),
                    json!(4.000_000_000_000_001),
                ]),
                any::<i64>().prop_map(|n| json!(n)),
                (-20i32..20).prop_map(|n| json!(n)),
                (-40i32..40).prop_map(|n| json!(f64::from(n) / 4.0)),
                any::<f64>()
                    .prop_filter("finite", |x| x.is_finite())
                    .prop_map(|x| json!(x)),
            ]
        }

        fn string() -> impl Strategy<Value = String> {
            prop_oneof![
                prop::sample::select(vec![
                    "",
                    "a",
                    "ab",
                    "abc",
                    "abcd",
                    "A",
                    "1",
                    "x1",
                    "x٣",
                    "٣",
                    "é",
                    "ab_1",
                    "kind",
                    "\u{1F600}",
                    "a\nb",
                ])
                .prop_map(String::from),
                prop::sample::select(KEYS.to_vec()).prop_map(String::from),
                "[a-c1٣é_ ]{0,5}",
                any::<String>(),
            ]
        }

        /// JSON values, mostly made of the numbers, strings and keys the schemas use.
        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                number(),
                string().prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                    prop::collection::vec(
                        (
                            prop_oneof![
                                3 => prop::sample::select(KEYS.to_vec()).prop_map(String::from),
                                1 => string(),
                            ],
                            inner
                        ),
                        0..5
                    )
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                ]
            })
        }

        fn small() -> impl Strategy<Value = Value> {
            (0u64..4).prop_map(|n| json!(n))
        }

        fn keys() -> impl Strategy<Value = Value> {
            prop::collection::vec(prop::sample::select(KEYS.to_vec()), 0..3).prop_map(|k| json!(k))
        }

        /// A schema with one keyword that takes no subschema.
        fn leaf_schema() -> BoxedStrategy<Value> {
            let types = prop::sample::select(vec![
                "null", "boolean", "object", "array", "string", "number", "integer",
            ]);
            let limit = prop::sample::select(vec![
                json!(0),
                json!(1),
                json!(2.5),
                json!(-1),
                json!(7),
                json!(0.3),
            ]);
            let multiple = prop::sample::select(vec![
                json!(0.5),
                json!(2),
                json!(3),
                json!(0.1),
                json!(0.01),
                json!(1e-3),
                json!(1.5),
            ]);
            prop_oneof![
                any::<bool>().prop_map(Value::Bool),
                types.clone().prop_map(|t| json!({ "type": t })),
                (types.clone(), types).prop_map(|(a, b)| json!({ "type": [a, b] })),
                prop::collection::vec(value(), 0..4).prop_map(|e| json!({ "enum": e })),
                value().prop_map(|c| json!({ "const": c })),
                (
                    prop::sample::select(vec![
                        "minimum",
                        "maximum",
                        "exclusiveMinimum",
                        "exclusiveMaximum"
                    ]),
                    limit
                )
                    .prop_map(|(k, n)| json!({ k: n })),
                multiple.prop_map(|m| json!({ "multipleOf": m })),
                (
                    prop::sample::select(vec![
                        "minLength",
                        "maxLength",
                        "minItems",
                        "maxItems",
                        "minProperties",
                        "maxProperties"
                    ]),
                    small()
                )
                    .prop_map(|(k, n)| json!({ k: n })),
                prop::sample::select(PATTERNS.to_vec()).prop_map(|p| json!({ "pattern": p })),
                any::<bool>().prop_map(|u| json!({ "uniqueItems": u })),
                keys().prop_map(|k| json!({ "required": k })),
                (prop::sample::select(KEYS.to_vec()), keys())
                    .prop_map(|(k, r)| json!({ "dependentRequired": { k: r } })),
                prop::sample::select(vec!["email", "date", "uri", "ipv4"])
                    .prop_map(|f| json!({ "format": f })),
                Just(json!({ "$ref": "#/$defs/d" })),
            ]
            .boxed()
        }

        /// Small schemas built from the keywords `Lite` checks; `#/$defs/d` is defined.
        fn schema() -> impl Strategy<Value = Value> {
            let tree = leaf_schema().prop_recursive(3, 16, 3, |inner| {
                let key = prop::sample::select(KEYS.to_vec());
                let list = prop::collection::vec(inner.clone(), 1..3);
                prop_oneof![
                    (key.clone(), inner.clone())
                        .prop_map(|(k, s)| json!({ "properties": { k: s } })),
                    (prop::sample::select(PATTERNS.to_vec()), inner.clone())
                        .prop_map(|(p, s)| json!({ "patternProperties": { p: s } })),
                    inner
                        .clone()
                        .prop_map(|s| json!({ "additionalProperties": s })),
                    (key.clone(), inner.clone(), inner.clone()).prop_map(|(k, s, a)| json!({
                        "properties": { k: s },
                        "additionalProperties": a
                    })),
                    inner.clone().prop_map(|s| json!({ "propertyNames": s })),
                    (key, inner.clone()).prop_map(|(k, s)| json!({ "dependentSchemas": { k: s } })),
                    inner.clone().prop_map(|s| json!({ "items": s })),
                    (list.clone(), prop::option::of(inner.clone())).prop_map(|(p, rest)| {
                        let mut s = json!({ "prefixItems": p });
                        if let Some(rest) = rest {
                            s["items"] = rest;
                        }
                        s
                    }),
                    (
                        inner.clone(),
                        prop::option::of(small()),
                        prop::option::of(small())
                    )
                        .prop_map(|(c, least, most)| {
                            let mut s = json!({ "contains": c });
                            if let Some(n) = least {
                                s["minContains"] = n;
                            }
                            if let Some(n) = most {
                                s["maxContains"] = n;
                            }
                            s
                        }),
                    list.clone().prop_map(|l| json!({ "allOf": l })),
                    list.clone().prop_map(|l| json!({ "anyOf": l })),
                    list.prop_map(|l| json!({ "oneOf": l })),
                    inner.clone().prop_map(|s| json!({ "not": s })),
                    (
                        inner.clone(),
                        prop::option::of(inner.clone()),
                        prop::option::of(inner.clone())
                    )
                        .prop_map(|(i, t, e)| {
                            let mut s = json!({ "if": i });
                            if let Some(t) = t {
                                s["then"] = t;
                            }
                            if let Some(e) = e {
                                s["else"] = e;
                            }
                            s
                        }),
                    // Two schemas' keywords in one object.
                    (inner.clone(), inner).prop_map(|(a, b)| match (a, b) {
                        (Value::Object(mut a), Value::Object(b)) => {
                            a.extend(b);
                            Value::Object(a)
                        }
                        (a, _) => a,
                    }),
                ]
            });
            // `#/$defs/d` may be referred to from the tree, not from itself.
            let defs = leaf_schema()
                .prop_filter("no reference", |s| s.get("$ref").is_none())
                .prop_recursive(2, 6, 2, |inner| {
                    prop_oneof![
                        inner.clone().prop_map(|s| json!({ "items": s })),
                        (prop::sample::select(KEYS.to_vec()), inner.clone())
                            .prop_map(|(k, s)| json!({ "properties": { k: s } })),
                        prop::collection::vec(inner, 1..3).prop_map(|l| json!({ "anyOf": l })),
                    ]
                });
            (tree, defs).prop_map(|(tree, d)| match tree {
                Value::Object(mut s) => {
                    s.insert("$defs".into(), json!({ "d": d }));
                    Value::Object(s)
                }
                other => other,
            })
        }

        /// Schemas written out for each keyword `Lite` checks, with values at their edges.
        fn written_schemas() -> Vec<Value> {
            vec![
                json!({"type": "integer"}),
                json!({"type": ["string", "null"]}),
                json!({"enum": [1, "a", [1], {"a": 1}, null]}),
                json!({"const": {"a": [1, 2.0]}}),
                json!({"minimum": 1, "maximum": 7}),
                json!({"exclusiveMinimum": 0, "exclusiveMaximum": 2.5}),
                json!({"minimum": 9_007_199_254_740_993_u64}),
                json!({"maximum": -9_007_199_254_740_993_i64}),
                json!({"multipleOf": 0.1}),
                json!({"multipleOf": 0.01}),
                json!({"multipleOf": 3}),
                json!({"multipleOf": 1e-3}),
                json!({"type": "integer", "multipleOf": 0.5}),
                json!({"minLength": 2, "maxLength": 3}),
                json!({"pattern": r"^\d+$"}),
                json!({"pattern": r"^\w+$"}),
                json!({"pattern": "x[0-9]$"}),
                json!({"format": "email"}),
                json!({"minItems": 1, "maxItems": 3, "uniqueItems": true}),
                json!({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false}),
                json!({"items": {"type": "number"}}),
                json!({"contains": {"type": "integer"}, "minContains": 2, "maxContains": 3}),
                json!({"contains": {"const": 1}, "minContains": 0}),
                json!({
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                    "patternProperties": {"^x": {"type": "number"}, r"\d": {"minimum": 0}},
                    "additionalProperties": false,
                    "required": ["a"]
                }),
                json!({"additionalProperties": {"type": "string"}}),
                json!({"minProperties": 1, "maxProperties": 2}),
                json!({"propertyNames": {"pattern": "^[a-c]+$"}}),
                json!({"dependentRequired": {"a": ["b", "c"]}}),
                json!({"dependentSchemas": {"a": {"required": ["kind"]}}}),
                json!({"allOf": [{"minimum": 0}, {"multipleOf": 2}]}),
                json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
                json!({"oneOf": [{"minimum": 0}, {"maximum": 10}]}),
                json!({"not": {"type": "object"}}),
                json!({
                    "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
                    "then": {"required": ["a"]},
                    "else": {"required": ["b"]}
                }),
                json!({
                    "$defs": {"node": {"type": "object", "properties": {"a": {"$ref": "#/$defs/node"}}}},
                    "$ref": "#/$defs/node"
                }),
                json!({"definitions": {"n": {"type": "array", "items": {"$ref": "#"}}}, "anyOf": [{"type": "integer"}, {"$ref": "#/definitions/n"}]}),
                json!({"$defs": {"a b": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/a%20b"}}}),
                // Draft 4–7 forms.
                json!({"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "integer"}], "additionalItems": {"type": "string"}}),
                json!({"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": ["b"], "b": {"required": ["c"]}}}),
                json!({"$schema": "http://json-schema.org/draft-04/schema#", "minimum": 1, "exclusiveMinimum": true}),
                json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}),
                json!({"dependencies": {"a": ["b"]}}),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

            #[test]
            fn written_schemas_agree_with_jsonschema(
                which in any::<prop::sample::Index>(),
                value in value(),
            ) {
                let schemas = written_schemas();
                let schema = which.get(&schemas);
                prop_assert!(agree(schema, &value).is_ok(), "{}", agree(schema, &value).unwrap_err());
            }

            #[test]
            fn generated_schemas_agree_with_jsonschema(schema in schema(), value in value()) {
                prop_assert!(agree(&schema, &value).is_ok(), "{}", agree(&schema, &value).unwrap_err());
            }
        }

        const D4: &str = "http://json-schema.org/draft-04/schema#";
        const D7: &str = "http://json-schema.org/draft-07/schema#";
        const D19: &str = "https://json-schema.org/draft/2019-09/schema";

        /// What the properties above found `Lite` getting wrong, each with `Lite`'s own verdict.
        #[test]
        fn divergences_found_are_fixed() {
            for (schema, value, valid) in [
                // Patterns are ECMA-262: `\w` and `\d` are ASCII.
                (json!({"pattern": r"^\w+$"}), json!("٣"), false),
                (json!({"pattern": r"^\d$"}), json!("٣"), false),
                (json!({"pattern": r"^\d$"}), json!("3"), true),
                (
                    json!({"patternProperties": {r"^\w$": false}}),
                    json!({"é": 1}),
                    true,
                ),
                // `multipleOf` is exact, not within a tolerance.
                (
                    json!({"multipleOf": 3}),
                    json!(370_488_982_361_164_u64),
                    false,
                ),
                (
                    json!({"multipleOf": 3}),
                    json!(370_488_982_361_163_u64),
                    true,
                ),
                (
                    json!({"multipleOf": 0.5}),
                    json!(-5.408_438_092_510_351e-53),
                    false,
                ),
                (json!({"multipleOf": 0.1}), json!(0.3), true),
                (json!({"multipleOf": 0.1}), json!(0.35), false),
                (json!({"multipleOf": 1e-3}), json!(1e300), true),
                // Counts written as whole floats.
                (json!({"minLength": 2.0}), json!("a"), false),
                (json!({"maxItems": 1.0}), json!([1, 2]), false),
                (
                    json!({"contains": true, "minContains": 2.0}),
                    json!([1]),
                    false,
                ),
                // Integers past 2^53 compare exactly.
                (
                    json!({"minimum": 9_007_199_254_740_993_u64}),
                    json!(9_007_199_254_740_992_u64),
                    false,
                ),
                (
                    json!({"const": 9_007_199_254_740_993_u64}),
                    json!(9_007_199_254_740_992_u64),
                    false,
                ),
                (
                    json!({"exclusiveMaximum": 9_007_199_254_740_992.0}),
                    json!(9_007_199_254_740_993_u64),
                    false,
                ),
                // The draft `$schema` names: its keywords, and up to draft 7 `$ref` hides the
                // keywords beside it.
                (
                    json!({"$schema": D7, "$ref": "#/definitions/a", "definitions": {"a": {"type": "string"}}, "type": "integer"}),
                    json!("x"),
                    true,
                ),
                (
                    json!({"$schema": D7, "dependentRequired": {"a": ["b"]}}),
                    json!({"a": 1}),
                    true,
                ),
                (
                    json!({"$schema": D7, "dependentSchemas": {"a": false}}),
                    json!({"a": 1}),
                    true,
                ),
                (
                    json!({"$schema": D7, "if": false, "else": false}),
                    json!(1),
                    false,
                ),
                (json!({"$schema": D4, "const": 1}), json!(2), true),
                (json!({"$schema": D4, "contains": false}), json!([1]), true),
                (
                    json!({"$schema": D4, "if": false, "else": false}),
                    json!(1),
                    true,
                ),
                (
                    json!({"$schema": D4, "propertyNames": false}),
                    json!({"a": 1}),
                    true,
                ),
                (json!({"$schema": D4, "type": "integer"}), json!(1.0), false),
                (
                    json!({"$schema": D4, "type": "integer"}),
                    json!(-2.955_039_302_955_817e213),
                    true,
                ),
                (
                    json!({"$schema": D19, "prefixItems": [false]}),
                    json!([1]),
                    true,
                ),
                (json!({"$schema": D19, "items": [false]}), json!([1]), false),
            ] {
                agree(&schema, &value).unwrap();
                let ours = Lite::new(&schema).unwrap().problems(&value, 1);
                assert_eq!(ours.is_empty(), valid, "{schema} {value}: {ours:?}");
            }
        }

        /// Schemas the drafts' meta-schemas refuse: a keyword's value of the wrong shape.
        fn malformed_schemas() -> Vec<(Value, &'static str)> {
            vec![
                (json!({"required": "a"}), "`required`"),
                (json!({"required": [1]}), "`required`"),
                (json!({"required": ["a", "a"]}), "`required`"),
                (json!({"$schema": D4, "required": []}), "`required`"),
                (json!({"type": 7}), "`type`"),
                (json!({"type": "text"}), "`type`"),
                (json!({"type": []}), "`type`"),
                (json!({"type": ["string", "string"]}), "`type`"),
                (json!({"enum": "a"}), "`enum`"),
                (json!({"minimum": "1"}), "`minimum`"),
                (json!({"exclusiveMaximum": true}), "`exclusiveMaximum`"),
                (
                    json!({"$schema": D4, "exclusiveMinimum": 1}),
                    "`exclusiveMinimum`",
                ),
                (
                    json!({"$schema": D4, "exclusiveMinimum": true}),
                    "`minimum`",
                ),
                (json!({"multipleOf": 0}), "`multipleOf`"),
                (json!({"multipleOf": -2}), "`multipleOf`"),
                (json!({"minLength": -1}), "`minLength`"),
                (json!({"maxItems": 1.5}), "`maxItems`"),
                (json!({"$schema": D4, "maxItems": 1.0}), "`maxItems`"),
                (json!({"minContains": "2"}), "`minContains`"),
                (json!({"pattern": 1}), "`pattern`"),
                (json!({"uniqueItems": 1}), "`uniqueItems`"),
                (json!({"format": 1}), "`format`"),
                (json!({"title": 1}), "`title`"),
                (json!({"properties": []}), "`properties`"),
                (json!({"properties": {"a": 1}}), "subschema"),
                (json!({"patternProperties": {"^a": "x"}}), "subschema"),
                (json!({"$defs": {"a": []}}), "subschema"),
                (json!({"additionalProperties": 1}), "subschema"),
                (json!({"items": [{"type": "string"}]}), "subschema"),
                (json!({"not": null}), "subschema"),
                (json!({"allOf": []}), "`allOf`"),
                (json!({"anyOf": {}}), "`anyOf`"),
                (json!({"oneOf": [1]}), "subschema"),
                (json!({"prefixItems": []}), "`prefixItems`"),
                (
                    json!({"dependentRequired": {"a": "b"}}),
                    "`dependentRequired`",
                ),
                (json!({"dependentRequired": []}), "`dependentRequired`"),
                (json!({"dependentSchemas": {"a": 1}}), "subschema"),
                (json!({"dependencies": {"a": [1]}}), "`dependencies`"),
                (json!({"examples": 1}), "`examples`"),
                (json!({"$schema": D7, "readOnly": "yes"}), "`readOnly`"),
                (json!({"$schema": D4, "not": true}), "subschema"),
                (json!({"$schema": D19, "items": []}), "`items`"),
                (
                    json!({"properties": {"a": {"properties": {"b": {"type": "str"}}}}}),
                    "`type`",
                ),
            ]
        }

        /// Each malformed schema is refused by both checkers, the WebAssembly one naming the
        /// keyword at fault.
        #[test]
        fn malformed_schemas_are_refused_by_both() {
            for (schema, words) in malformed_schemas() {
                assert!(jsonschema::validator_for(&schema).is_err(), "{schema}");
                let e = Lite::new(&schema)
                    .err()
                    .unwrap_or_else(|| panic!("{schema} read"));
                assert!(e.contains(words), "{schema}: {e}");
                agree(&schema, &json!(1)).unwrap();
            }
        }

        /// Keywords' names used as property names, definitions' names, or under keywords
        /// that no draft has, are not read as keywords.
        #[test]
        fn keywords_as_names_are_not_keywords() {
            for schema in [
                json!({"properties": {"type": {"type": "string"}, "required": {}, "pattern": {"enum": [1]}}}),
                json!({"$defs": {"type": {"minimum": 1}}, "$ref": "#/$defs/type"}),
                json!({"x-extra": {"type": 7, "required": "a", "pattern": 1}}),
                json!({"dependentSchemas": {"enum": {"required": ["a"]}}}),
            ] {
                assert!(jsonschema::validator_for(&schema).is_ok(), "{schema}");
                assert!(Lite::new(&schema).is_ok(), "{schema}");
            }
        }

        #[test]
        fn every_written_schema_is_read_by_both() {
            for schema in written_schemas() {
                assert!(jsonschema::validator_for(&schema).is_ok(), "{schema}");
                assert!(Lite::new(&schema).is_ok(), "{schema}");
            }
        }
    }
}
