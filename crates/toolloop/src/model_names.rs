//! How a model's name finds its row in a table keyed by model names (prices, limits).
//!
//! A lookup tries, in order, the name as given, the name without a `provider:` prefix, and the
//! name without each leading `vendor/` path segment (`openrouter/anthropic/claude-sonnet-4`
//! then `anthropic/claude-sonnet-4` then `claude-sonnet-4`), each exactly and then ignoring
//! ASCII case; failing that, the longest entry that one of them starts with followed by `-` (so
//! a dated `gpt-4o-2099-01-01` finds `gpt-4o`).

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::OnceLock;

/// A built-in table (prices, limits): rows by model name, the names borrowed from the vendored
/// dataset, under a fast hash (the names are the crate's own data, not an attacker's).
pub(crate) type Builtin<T> = foldhash::HashMap<Cow<'static, str>, Row<T>>;

/// A row of a built-in table. A dataset's row keeps its figures as written until a lookup first
/// finds it, and is read then, once: a process indexes the thousands of names at its first
/// lookup, but reads only the rows it finds (reading every row's numbers was most of the start
/// of a one-round `toolloop run`).
pub(crate) struct Row<T> {
    text: Option<&'static RawValue>,
    value: OnceLock<Option<T>>,
}

impl<T> Row<T> {
    /// A row of the vendored dataset, its figures as written there.
    pub(crate) fn written(text: &'static RawValue) -> Self {
        Row {
            text: Some(text),
            value: OnceLock::new(),
        }
    }

    /// A row given whole (the hand-checked rows).
    pub(crate) fn given(value: T) -> Self {
        Row {
            text: None,
            value: OnceLock::from(Some(value)),
        }
    }

    /// The row's value, read by `read` from its text the first time (`None`: the row does not
    /// hold what `read` needs, and counts as no entry).
    pub(crate) fn get(&self, read: impl FnOnce(&'static str) -> Option<T>) -> Option<&T> {
        self.value
            .get_or_init(|| self.text.and_then(|t| read(t.get())))
            .as_ref()
    }
}

/// A built-in table: its rows by model name, and the date its dataset was retrieved.
pub(crate) struct Table<T> {
    pub(crate) rows: Builtin<T>,
    pub(crate) retrieved: Cow<'static, str>,
}

impl<T> Table<T> {
    /// Indexes a vendored dataset (see `data/README.md`) whose columns must be `columns`, with
    /// room for `more` rows besides. A dataset that does not read gives an empty table and a
    /// warning naming `what` (a test reads each one: a broken build must not crash a run).
    pub(crate) fn vendored(text: &'static str, columns: &[&str], more: usize, what: &str) -> Self {
        Self::index(text, columns, more).unwrap_or_else(|e| {
            tracing::warn!("the built-in {what} dataset does not parse: {e}");
            Table {
                rows: Builtin::default(),
                retrieved: Cow::Borrowed(""),
            }
        })
    }

    /// [`Table::vendored`], with the error.
    pub(crate) fn index(text: &'static str, columns: &[&str], more: usize) -> Result<Self, String> {
        let d: Dataset<&RawValue> = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if d.columns != columns {
            return Err(format!("unexpected columns {:?}", d.columns));
        }
        let mut rows =
            Builtin::with_capacity_and_hasher(d.models.0.len() + more, Default::default());
        for (name, row) in d.models.0 {
            rows.insert(name, Row::written(row));
        }
        Ok(Table {
            rows,
            retrieved: d.retrieved,
        })
    }

    /// The row of `model` (see the [module docs](self)), read the first time by `read` from its
    /// figures' text and the dataset's date.
    pub(crate) fn get(
        &self,
        model: &str,
        read: impl FnOnce(&'static str, &str) -> Option<T>,
    ) -> Option<&T> {
        lookup(&self.rows, model).and_then(|row| self.read(row, read))
    }

    /// `row`'s value, read the first time as [`Table::get`] reads it.
    pub(crate) fn read<'a>(
        &'a self,
        row: &'a Row<T>,
        read: impl FnOnce(&'static str, &str) -> Option<T>,
    ) -> Option<&'a T> {
        row.get(|text| read(text, &self.retrieved))
    }
}

/// A vendored dataset (`data/*.json`, see `data/README.md`): when it was retrieved, its
/// columns, and a row per model (its figures, or their text for a [`Row`]). Read with the names
/// and the date borrowed from the text (a table of thousands of rows is indexed at the first
/// lookup of every process that looks up a price or a limit).
#[derive(Deserialize)]
pub(crate) struct Dataset<'a, T> {
    #[serde(borrow)]
    pub(crate) retrieved: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) columns: Vec<Cow<'a, str>>,
    #[serde(borrow)]
    pub(crate) models: Rows<'a, T>,
}

/// The rows of a dataset's `models` object, in the file's order.
pub(crate) struct Rows<'a, T>(pub(crate) Vec<(Cow<'a, str>, T)>);

/// A model name, borrowed from the text when it has no escapes.
#[derive(Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de: 'a, 'a, T: Deserialize<'de>> Deserialize<'de> for Rows<'a, T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a, T>(std::marker::PhantomData<(&'a (), T)>);
        impl<'de: 'a, 'a, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<'a, T> {
            type Value = Rows<'a, T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of rows by model name")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut rows = Vec::with_capacity(map.size_hint().unwrap_or(4096));
                while let Some((Name(name), row)) = map.next_entry::<Name<'de>, T>()? {
                    rows.push((name, row));
                }
                Ok(Rows(rows))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// The names a model is looked up under, most specific first.
fn candidates(model: &str) -> Vec<&str> {
    let mut out = vec![model];
    let bare = model.rsplit_once(':').map_or(model, |(_, m)| m);
    if bare != model {
        out.push(bare);
    }
    let mut rest = bare;
    while let Some((_, tail)) = rest.split_once('/') {
        if !tail.is_empty() {
            out.push(tail);
        }
        rest = tail;
    }
    out
}

/// The row of `model` in `table` (see the [module docs](self) for the order of the tries).
pub(crate) fn lookup<'a, K, T, S>(table: &'a HashMap<K, T, S>, model: &str) -> Option<&'a T>
where
    K: Borrow<str> + Hash + Eq,
    S: BuildHasher,
{
    let names = candidates(model);
    for name in &names {
        if let Some(p) = table.get(*name) {
            return Some(p);
        }
    }
    for name in &names {
        if let Some((_, p)) = table
            .iter()
            .find(|(k, _)| text(*k).eq_ignore_ascii_case(name))
        {
            return Some(p);
        }
    }
    for name in &names {
        let found = table
            .iter()
            .filter(|(k, _)| {
                let k = text(*k);
                name.len() > k.len()
                    && name.as_bytes()[..k.len()].eq_ignore_ascii_case(k.as_bytes())
                    && name.as_bytes()[k.len()] == b'-'
            })
            .max_by_key(|(k, _)| text(*k).len());
        if let Some((_, p)) = found {
            return Some(p);
        }
    }
    None
}

/// A table's key as text.
fn text<K: Borrow<str>>(k: &K) -> &str {
    k.borrow()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fall_back_from_the_most_specific() {
        assert_eq!(
            candidates("openrouter:openrouter/anthropic/claude-sonnet-4"),
            [
                "openrouter:openrouter/anthropic/claude-sonnet-4",
                "openrouter/anthropic/claude-sonnet-4",
                "anthropic/claude-sonnet-4",
                "claude-sonnet-4"
            ]
        );
        let table: HashMap<String, u8> =
            [("gpt-4o".to_string(), 1), ("gpt-4o-mini".to_string(), 2)].into();
        assert_eq!(lookup(&table, "GPT-4O"), Some(&1));
        assert_eq!(lookup(&table, "openai:gpt-4o-mini-2024-07-18"), Some(&2));
        assert_eq!(lookup(&table, "gpt-4oz"), None);
        assert_eq!(lookup(&table, ""), None);
    }

    #[test]
    fn a_dataset_is_read_with_its_names_borrowed_unless_escaped() {
        let text = r#"{"retrieved": "2026-01-01", "columns": ["a"],
            "models": {"gpt-4o": [1], "caf\u00e9": [null], "gpt-4o": [2]}}"#;
        let d: Dataset<[Option<u8>; 1]> = serde_json::from_str(text).unwrap();
        assert_eq!(d.retrieved, "2026-01-01");
        assert_eq!(d.columns, ["a"]);
        let rows = &d.models.0;
        assert_eq!(rows.len(), 3);
        assert!(matches!(rows[0].0, Cow::Borrowed("gpt-4o")));
        assert!(matches!(&rows[1].0, Cow::Owned(n) if n == "café"));
        // Later rows of a name win, as in a map read from the same text.
        let table: foldhash::HashMap<_, Option<u8>> =
            d.models.0.into_iter().map(|(n, [v])| (n, v)).collect();
        assert_eq!(lookup(&table, "openai:GPT-4o-2024"), Some(&Some(2)));
        assert_eq!(lookup(&table, "café"), Some(&None));
        let wrong: Result<Dataset<[Option<u8>; 1]>, _> =
            serde_json::from_str(r#"{"retrieved": "x", "columns": [], "models": [1]}"#);
        assert!(wrong.is_err());
    }
}
