//! Checking a JSON value against a JSON Schema (tool arguments, final answers).
//!
//! Natively this is the `jsonschema` crate. In WebAssembly (the npm package's module) it is a
//! compact checker of its own, so that the module stays small: the `jsonschema` crate with its
//! regular-expression engines, big numbers and bundled meta-schemas is about half the module.
//! It checks the keywords of JSON Schema's validation vocabulary (`type`, `enum`, `const`, the
//! numeric, string, array and object keywords, `pattern` and `patternProperties` with the
//! `regex` crate, `allOf`/`anyOf`/`oneOf`/`not`, `if`/`then`/`else`, `dependentRequired`,
//! `dependentSchemas`, draft 4–7's `dependencies` and tuple `items`) and follows references
//! inside the schema (`#`, `#/$defs/…`, `#/definitions/…`). `format` is an annotation, as it
//! is natively by default. A schema that uses what it does not check (`unevaluatedProperties`,
//! `unevaluatedItems`, `$dynamicRef`, `$recursiveRef`, a reference to another document, a
//! pattern the `regex` crate does not read) is refused when the tools are set, naming the
//! keyword: never accepted and left unchecked.

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
    }

    impl Lite {
        pub(crate) fn new(schema: &Value) -> Result<Lite, String> {
            let mut lite = Lite {
                root: schema.clone(),
                patterns: HashMap::new(),
            };
            if !schema.is_object() && !schema.is_boolean() {
                return Err(format!(
                    "{schema} is not a JSON Schema (an object or a boolean)"
                ));
            }
            lite.prepare(schema, schema, 0)?;
            Ok(lite)
        }

        /// Compiles the patterns of `schema` and its subschemas, and refuses what is not
        /// checked here.
        fn prepare(&mut self, root: &Value, schema: &Value, depth: usize) -> Result<(), String> {
            if depth > MAX_DEPTH {
                return Err("the schema is nested too deeply".into());
            }
            let Value::Object(s) = schema else {
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
            if let Some(r) = s.get("$ref") {
                let r = r.as_str().ok_or("`$ref` must be a string")?;
                if resolve(root, r).is_none() {
                    return Err(format!(
                        "the reference `{r}` does not lead to a part of this schema (only \
                         references inside the schema are followed)"
                    ));
                }
            }
            if let Some(p) = s.get("pattern") {
                let p = p.as_str().ok_or("`pattern` must be a string")?;
                self.compile(p)?;
            }
            if let Some(Value::Object(props)) = s.get("patternProperties") {
                for p in props.keys() {
                    self.compile(p)?;
                }
            }
            if let Some(t) = s.get("type") {
                let ok = match t {
                    Value::String(_) => true,
                    Value::Array(a) => a.iter().all(Value::is_string),
                    _ => false,
                };
                if !ok {
                    return Err(format!("`type` must be a string or strings, not {t}"));
                }
            }
            for (keyword, sub) in s {
                match (keyword.as_str(), sub) {
                    // Values, not schemas.
                    ("enum" | "const" | "default" | "examples" | "required" | "type", _) => {}
                    (_, Value::Object(_)) => self.prepare(root, sub, depth + 1)?,
                    (_, Value::Array(items)) => {
                        for item in items {
                            self.prepare(root, item, depth + 1)?;
                        }
                    }
                    _ => {}
                }
            }
            Ok(())
        }

        fn compile(&mut self, pattern: &str) -> Result<(), String> {
            if !self.patterns.contains_key(pattern) {
                let re = regex::Regex::new(pattern)
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
            if let Some(r) = s.get("$ref").and_then(Value::as_str)
                && let Some(target) = resolve(&self.root, r)
            {
                self.check(target, value, path, out, most, depth + 1);
            }
            if let Some(t) = s.get("type") {
                let fits = match t {
                    Value::String(t) => is_type(value, t),
                    Value::Array(ts) => ts
                        .iter()
                        .filter_map(Value::as_str)
                        .any(|t| is_type(value, t)),
                    _ => true,
                };
                if !fits {
                    push(out, most, path, format!("{value} is not of type {t}"));
                }
            }
            if let Some(Value::Array(options)) = s.get("enum")
                && !options.iter().any(|o| same(o, value))
            {
                push(
                    out,
                    most,
                    path,
                    format!("{value} is not one of {}", Value::Array(options.clone())),
                );
            }
            if let Some(c) = s.get("const")
                && !same(c, value)
            {
                push(out, most, path, format!("{c} was expected"));
            }
            match value {
                Value::Number(n) => {
                    let x = n.as_f64().unwrap_or(f64::NAN);
                    let num = |k: &str| s.get(k).and_then(Value::as_f64);
                    let draft4_exclusive =
                        |k: &str| s.get(k).and_then(Value::as_bool) == Some(true);
                    if let Some(m) = num("minimum") {
                        if draft4_exclusive("exclusiveMinimum") && x <= m {
                            push(
                                out,
                                most,
                                path,
                                format!("{value} is less than or equal to the minimum of {m}"),
                            );
                        } else if x < m {
                            push(
                                out,
                                most,
                                path,
                                format!("{value} is less than the minimum of {m}"),
                            );
                        }
                    }
                    if let Some(m) = num("maximum") {
                        if draft4_exclusive("exclusiveMaximum") && x >= m {
                            push(
                                out,
                                most,
                                path,
                                format!("{value} is greater than or equal to the maximum of {m}"),
                            );
                        } else if x > m {
                            push(
                                out,
                                most,
                                path,
                                format!("{value} is greater than the maximum of {m}"),
                            );
                        }
                    }
                    if let Some(m) = num("exclusiveMinimum")
                        && x <= m
                    {
                        push(
                            out,
                            most,
                            path,
                            format!("{value} is less than or equal to the minimum of {m}"),
                        );
                    }
                    if let Some(m) = num("exclusiveMaximum")
                        && x >= m
                    {
                        push(
                            out,
                            most,
                            path,
                            format!("{value} is greater than or equal to the maximum of {m}"),
                        );
                    }
                    if let Some(m) = num("multipleOf").filter(|m| *m > 0.0) {
                        let q = x / m;
                        if !q.is_finite() || (q - q.round()).abs() > 1e-9 * q.abs().max(1.0) {
                            push(out, most, path, format!("{value} is not a multiple of {m}"));
                        }
                    }
                }
                Value::String(text) => {
                    let len = || text.chars().count() as u64;
                    if let Some(m) = s.get("minLength").and_then(Value::as_u64)
                        && len() < m
                    {
                        push(
                            out,
                            most,
                            path,
                            format!("{value} is shorter than {m} characters"),
                        );
                    }
                    if let Some(m) = s.get("maxLength").and_then(Value::as_u64)
                        && len() > m
                    {
                        push(
                            out,
                            most,
                            path,
                            format!("{value} is longer than {m} characters"),
                        );
                    }
                    if let Some(p) = s.get("pattern").and_then(Value::as_str)
                        && let Some(re) = self.patterns.get(p)
                        && !re.is_match(text)
                    {
                        push(out, most, path, format!("{value} does not match \"{p}\""));
                    }
                }
                Value::Array(items) => {
                    let n = items.len() as u64;
                    if let Some(m) = s.get("minItems").and_then(Value::as_u64)
                        && n < m
                    {
                        push(out, most, path, format!("{value} has less than {m} items"));
                    }
                    if let Some(m) = s.get("maxItems").and_then(Value::as_u64)
                        && n > m
                    {
                        push(out, most, path, format!("{value} has more than {m} items"));
                    }
                    if s.get("uniqueItems").and_then(Value::as_bool) == Some(true)
                        && items
                            .iter()
                            .enumerate()
                            .any(|(i, a)| items[i + 1..].iter().any(|b| same(a, b)))
                    {
                        push(out, most, path, format!("{value} has non-unique elements"));
                    }
                    // The schemas of the first items (`prefixItems`, or draft 4–7's `items`
                    // array), then of the rest (`items`, or `additionalItems` after an array).
                    let (prefix, rest) = match (s.get("prefixItems"), s.get("items")) {
                        (Some(Value::Array(p)), rest) => (p.as_slice(), rest),
                        (_, Some(Value::Array(p))) => (p.as_slice(), s.get("additionalItems")),
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
                    if let Some(c) = s.get("contains") {
                        let found = items
                            .iter()
                            .filter(|i| self.is_valid(c, i, depth + 1))
                            .count() as u64;
                        let least = s.get("minContains").and_then(Value::as_u64).unwrap_or(1);
                        if found < least {
                            push(
                                out,
                                most,
                                path,
                                format!("None of {value} are valid under the given schema"),
                            );
                        }
                        if let Some(m) = s.get("maxContains").and_then(Value::as_u64)
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
            if let Some(Value::Array(all)) = s.get("allOf") {
                for sub in all {
                    self.check(sub, value, path, out, most, depth + 1);
                }
            }
            if let Some(Value::Array(any)) = s.get("anyOf")
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
            if let Some(Value::Array(one)) = s.get("oneOf") {
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
            if let Some(not) = s.get("not")
                && self.is_valid(not, value, depth + 1)
            {
                push(
                    out,
                    most,
                    path,
                    format!("{value} should not be valid under {not}"),
                );
            }
            if let Some(cond) = s.get("if") {
                let branch = if self.is_valid(cond, value, depth + 1) {
                    s.get("then")
                } else {
                    s.get("else")
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
            if let Some(m) = s.get("minProperties").and_then(Value::as_u64)
                && n < m
            {
                fail(out, path, format!("{value} has less than {m} properties"));
            }
            if let Some(m) = s.get("maxProperties").and_then(Value::as_u64)
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
            if let Some(Value::Array(names)) = s.get("required") {
                required(out, path, names);
            }
            for key in ["dependentRequired", "dependencies"] {
                if let Some(Value::Object(deps)) = s.get(key) {
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
            if let Some(Value::Object(deps)) = s.get("dependentSchemas") {
                for (name, schema) in deps {
                    if obj.contains_key(name) {
                        self.check(schema, value, path, out, most, depth + 1);
                    }
                }
            }
            let props = s.get("properties").and_then(Value::as_object);
            let patterns = s.get("patternProperties").and_then(Value::as_object);
            let additional = s.get("additionalProperties");
            let names = s.get("propertyNames");
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

    /// Adds a problem at `path`, unless `out` holds `most` already.
    fn push(out: &mut Vec<String>, most: usize, path: &str, message: String) {
        if out.len() < most {
            out.push(at(path, &message));
        }
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

    /// JSON equality, with numbers equal by value (`1` and `1.0`).
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
                (Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            },
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
            assert!(problems(json!({"minimum": 1, "exclusiveMinimum": true}), json!(1)).len() == 1);
            assert!(problems(json!({"const": 1}), json!(1.0)).is_empty());
            assert!(problems(json!({"type": "integer"}), json!(3.0)).is_empty());
            assert!(problems(json!(false), json!(1)).len() == 1);
        }

        #[test]
        fn recursive_references_end() {
            let s = json!({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"});
            assert!(problems(s.clone(), json!({"next": {"next": {}}})).is_empty());
            assert_eq!(problems(s, json!({"next": {"next": 1}})).len(), 1);
            // A reference to itself, with no progress in the value: it ends, with a problem.
            let s = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
            assert_eq!(problems(s, json!(1)).len(), 1);
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
                (json!(3), "not a JSON Schema"),
            ] {
                let e = Lite::new(&schema).err().expect("refused");
                assert!(e.contains(words), "{e}");
            }
        }
    }
}
