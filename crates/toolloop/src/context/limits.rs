//! A model's limits: how many tokens a request's input may hold, and how many one answer may
//! produce, looked up by model name like its [price](crate::price).
//!
//! The built-in table is LiteLLM's model dataset (MIT; vendored in `data/limits.json` with its
//! source, license and date, reduced to chat models by `scripts/update-prices`), read once on
//! first use: `max_input_tokens` is the context window, `max_output_tokens` the output limit.
//! Users add or override entries with [`LimitTable::insert`] or [`LimitTable::extend_from_json`];
//! an entry added to a table wins over the built-in one.

use crate::model_names::{Table, lookup};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::LazyLock;

/// The limits of one model, in tokens. `None` where the source does not say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelLimits {
    /// The most tokens a request's input may hold: the conversation, the system prompt, the
    /// tool catalog (LiteLLM's `max_input_tokens`). For most models the answer shares this
    /// window, so a request whose input comes near it leaves little room to answer.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// The most tokens one answer may hold (LiteLLM's `max_output_tokens`).
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// Where the figures come from.
    #[serde(default)]
    pub source: String,
    /// When they were read (YYYY-MM-DD).
    #[serde(default)]
    pub as_of: String,
}

impl ModelLimits {
    /// Limits with the given context window and output limit, and no source.
    pub fn new(context_window: u64, max_output_tokens: u64) -> Self {
        ModelLimits {
            context_window: Some(context_window),
            max_output_tokens: Some(max_output_tokens),
            source: String::new(),
            as_of: String::new(),
        }
    }
}

/// Limits by model name, found the way [`crate::price::PriceTable`] finds prices: the name as
/// given, without a `provider:` prefix, without each leading `vendor/` segment, ignoring ASCII
/// case, and then the longest entry the name starts with followed by `-` (a dated
/// `gpt-4o-2099-01-01` finds `gpt-4o`). Entries added to the table win over the built-in ones.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LimitTable {
    limits: HashMap<String, ModelLimits>,
    /// Whether lookups fall back to the built-in table.
    #[serde(skip)]
    builtin: bool,
}

/// The vendored dataset: `data/limits.json`.
const DATASET: &str = include_str!("../../data/limits.json");

const DATASET_SOURCE: &str =
    "LiteLLM model_prices_and_context_window.json (https://github.com/BerriAI/litellm)";

static BUILTIN_TABLE: LazyLock<Table<ModelLimits>> =
    LazyLock::new(|| Table::vendored(DATASET, &COLUMNS, 0, "model limits"));

/// The dataset's columns (see `data/README.md`).
const COLUMNS: [&str; 2] = ["context_window", "max_output_tokens"];

/// Limits from a row of the dataset (its figures' text) retrieved on `as_of`.
fn read_limits(text: &str, as_of: &str) -> Option<ModelLimits> {
    let [context_window, max_output_tokens]: [Option<u64>; 2] = serde_json::from_str(text).ok()?;
    Some(ModelLimits {
        context_window,
        max_output_tokens,
        source: DATASET_SOURCE.to_string(),
        as_of: as_of.to_string(),
    })
}

impl LimitTable {
    /// An empty table (every limit unknown until entries are added).
    pub fn empty() -> Self {
        LimitTable::default()
    }

    /// The built-in table: LiteLLM's dataset for chat models (thousands of models, of every
    /// provider), read once on first use.
    pub fn builtin() -> Self {
        LimitTable {
            limits: HashMap::new(),
            builtin: true,
        }
    }

    /// Adds or replaces a model's limits.
    pub fn insert(&mut self, model: impl Into<String>, limits: ModelLimits) {
        self.limits.insert(model.into(), limits);
    }

    /// The limits of a model, if known.
    pub fn get(&self, model: &str) -> Option<&ModelLimits> {
        lookup(&self.limits, model).or_else(|| {
            if self.builtin {
                BUILTIN_TABLE.get(model, read_limits)
            } else {
                None
            }
        })
    }

    /// The context window of a model, if known.
    pub fn context_window(&self, model: &str) -> Option<u64> {
        self.get(model).and_then(|l| l.context_window)
    }

    /// The output limit of a model, if known.
    pub fn max_output_tokens(&self, model: &str) -> Option<u64> {
        self.get(model).and_then(|l| l.max_output_tokens)
    }

    /// Adds or replaces entries read from JSON: an object from model name to limits, in
    /// tokens. Each entry gives `context_window`, `max_output_tokens` or both; `source` and
    /// `as_of` are free text:
    ///
    /// ```json
    /// {"my-local-model": {"context_window": 32768, "max_output_tokens": 4096},
    ///  "gpt-4o": {"context_window": 64000, "source": "our gateway's cap"}}
    /// ```
    ///
    /// A limit of 0, or an entry that gives neither, is an error; nothing is added when any
    /// entry is wrong.
    pub fn extend_from_json(&mut self, json: &str) -> Result<(), serde_json::Error> {
        use serde::de::Error as _;
        let extra: HashMap<String, ModelLimits> = serde_json::from_str(json)?;
        for (name, l) in &extra {
            if l.context_window.is_none() && l.max_output_tokens.is_none() {
                return Err(serde_json::Error::custom(format!(
                    "the limits of `{name}` give neither `context_window` nor \
                     `max_output_tokens`"
                )));
            }
            if l.context_window == Some(0) || l.max_output_tokens == Some(0) {
                return Err(serde_json::Error::custom(format!(
                    "the limits of `{name}` hold a limit of 0; limits are token counts above 0"
                )));
            }
        }
        self.limits.extend(extra);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dataset_parses_and_knows_the_main_families() {
        let all = Table::<ModelLimits>::index(DATASET, &COLUMNS, 0).unwrap();
        assert!(all.rows.len() > 1000, "{}", all.rows.len());
        // Every row reads (rows are read when first found, so a bad one would only show then).
        for (name, row) in &all.rows {
            let l = all.read(row, read_limits);
            assert!(
                l.is_some_and(|l| l.context_window.is_some() || l.max_output_tokens.is_some()),
                "{name}: {l:?}"
            );
        }
        let t = LimitTable::builtin();
        // Figures as the vendored dataset gives them (see data/limits.json).
        assert_eq!(t.context_window("gpt-4o"), Some(128_000));
        assert_eq!(t.max_output_tokens("gpt-4o"), Some(16_384));
        assert_eq!(t.context_window("openai:gpt-4o-2024-08-06"), Some(128_000));
        assert_eq!(t.context_window("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(t.context_window("gemini:gemini-2.5-pro"), Some(1_048_576));
        assert_eq!(
            t.context_window("openrouter/deepseek/deepseek-chat"),
            Some(131_072)
        );
        let l = t.get("claude-opus-4-5-20251101").unwrap();
        assert_eq!(l.max_output_tokens, Some(64_000));
        assert!(l.source.contains("LiteLLM") && !l.as_of.is_empty(), "{l:?}");
    }

    #[test]
    fn unknown_models_have_unknown_limits() {
        let t = LimitTable::builtin();
        for name in [
            "my-local-model",
            "mock:rounds=3",
            "openrouter/nobody/none",
            "-",
            "",
        ] {
            assert!(t.get(name).is_none(), "{name}");
        }
        assert!(LimitTable::empty().get("gpt-4o").is_none());
    }

    #[test]
    fn entries_added_win_over_the_dataset() {
        let mut t = LimitTable::builtin();
        t.extend_from_json(
            r#"{"gpt-4o": {"context_window": 64000}, "my-model": {"max_output_tokens": 512}}"#,
        )
        .unwrap();
        assert_eq!(t.context_window("gpt-4o-2024-08-06"), Some(64_000));
        // An override that gives only the window does not borrow the dataset's output limit.
        assert_eq!(t.max_output_tokens("gpt-4o"), None);
        assert_eq!(t.max_output_tokens("my-model"), Some(512));
        t.insert("llama.cpp", ModelLimits::new(8192, 1024));
        assert_eq!(t.context_window("llama.cpp"), Some(8192));

        for bad in [
            r#"{"x": {}}"#,
            r#"{"x": {"context_window": 0}}"#,
            r#"{"x": {"context_window": -1}}"#,
            r#"{"x": {"context_window": "big"}}"#,
            r#"{"y": {"context_window": 10}, "x": {"max_output_tokens": 0}}"#,
        ] {
            assert!(t.extend_from_json(bad).is_err(), "{bad}");
        }
        assert!(t.get("x").is_none() && t.get("y").is_none());
    }
}
