//! Prices per model, and the cost of a run.
//!
//! Prices are US dollars per million tokens. A model with no price has an unknown cost (`None`),
//! never a cost of 0. The built-in table is LiteLLM's maintained price dataset (MIT; vendored in
//! `data/prices.json` with its source, license and date, reduced to chat models by
//! `scripts/update-prices`), read once on first use, plus a few hand-checked entries it lacks.
//! Users add or override entries with [`PriceTable::insert`] or
//! [`PriceTable::extend_from_json`] (the command's `--prices FILE`).

use crate::model_names::{Row, Table, lookup};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;

/// The price of one model, in US dollars per million tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Price {
    /// Uncached input tokens.
    pub input: f64,
    /// Output tokens (reasoning included).
    pub output: f64,
    /// Input tokens read from the prompt cache; `None` means the input rate.
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Input tokens written to the prompt cache; `None` means the input rate.
    #[serde(default)]
    pub cache_write: Option<f64>,
    /// Where the figures come from.
    #[serde(default)]
    pub source: String,
    /// When they were read (YYYY-MM-DD).
    #[serde(default)]
    pub as_of: String,
}

impl Price {
    /// A price with input and output rates only.
    pub fn new(input: f64, output: f64) -> Self {
        Price {
            input,
            output,
            cache_read: None,
            cache_write: None,
            source: String::new(),
            as_of: String::new(),
        }
    }

    /// The cost of `usage` at this price, in US dollars.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let per = |tokens: u64, rate: f64| tokens as f64 * rate / 1_000_000.0;
        per(usage.uncached_input_tokens(), self.input)
            + per(
                usage.cache_read_tokens,
                self.cache_read.unwrap_or(self.input),
            )
            + per(
                usage.cache_write_tokens,
                self.cache_write.unwrap_or(self.input),
            )
            + per(usage.output_tokens, self.output)
    }
}

/// Prices by model name.
///
/// A lookup tries, in order, the name as given, the name without a `provider:` prefix, and the
/// name without each leading `vendor/` path segment (`openrouter/anthropic/claude-sonnet-4`
/// then `anthropic/claude-sonnet-4` then `claude-sonnet-4`), each exactly and then ignoring
/// ASCII case; failing that, the longest entry that one of them starts with followed by `-` (so
/// a dated `gpt-4o-2099-01-01` finds `gpt-4o`). Entries added to the table win over the
/// built-in ones. [`crate::context::LimitTable`] finds a model's context window the same way.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PriceTable {
    prices: HashMap<String, Price>,
    /// Whether lookups fall back to the built-in table.
    #[serde(skip)]
    builtin: bool,
}

/// The vendored dataset: `data/prices.json`.
const DATASET: &str = include_str!("../data/prices.json");

/// The built-in prices: the dataset, then the hand-checked rows for names it lacks.
static BUILTIN_TABLE: LazyLock<Table<Price>> = LazyLock::new(|| {
    let mut table = Table::vendored(DATASET, &COLUMNS, BUILTIN.len(), "price");
    for (name, input, output, cache_read, cache_write, source) in BUILTIN {
        table.rows.entry(Cow::Borrowed(*name)).or_insert_with(|| {
            Row::given(Price {
                input: *input,
                output: *output,
                cache_read: *cache_read,
                cache_write: *cache_write,
                source: (*source).to_string(),
                as_of: BUILTIN_AS_OF.to_string(),
            })
        });
    }
    table
});

/// The dataset's columns (see `data/README.md`).
const COLUMNS: [&str; 4] = ["input", "output", "cache_read", "cache_write"];

/// A price from a row of the dataset (its figures' text) retrieved on `as_of`; `None` when the
/// row lacks an input or output rate.
fn read_price(text: &str, as_of: &str) -> Option<Price> {
    let [input, output, cache_read, cache_write]: [Option<f64>; 4] =
        serde_json::from_str(text).ok()?;
    Some(Price {
        input: input?,
        output: output?,
        cache_read,
        cache_write,
        source: DATASET_SOURCE.to_string(),
        as_of: as_of.to_string(),
    })
}

const DATASET_SOURCE: &str =
    "LiteLLM model_prices_and_context_window.json (https://github.com/BerriAI/litellm)";

impl PriceTable {
    /// An empty table (every cost unknown until entries are added).
    pub fn empty() -> Self {
        PriceTable::default()
    }

    /// The built-in table: LiteLLM's price dataset for chat models (thousands of models, of
    /// every provider), read once on first use.
    pub fn builtin() -> Self {
        PriceTable {
            prices: HashMap::new(),
            builtin: true,
        }
    }

    /// Adds or replaces a model's price.
    pub fn insert(&mut self, model: impl Into<String>, price: Price) {
        self.prices.insert(model.into(), price);
    }

    /// The price of a model, if known.
    pub fn get(&self, model: &str) -> Option<&Price> {
        lookup(&self.prices, model).or_else(|| {
            if self.builtin {
                BUILTIN_TABLE.get(model, read_price)
            } else {
                None
            }
        })
    }

    /// The cost of `usage` on `model`, or `None` when the model has no price.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        self.get(model).map(|p| p.cost(usage))
    }

    /// Adds or replaces entries read from JSON: an object from model name to price, in US
    /// dollars per million tokens. `input` and `output` are required; `cache_read` and
    /// `cache_write` default to the input rate; `source` and `as_of` are free text:
    ///
    /// ```json
    /// {"my-model": {"input": 1.0, "output": 2.0},
    ///  "gpt-4o": {"input": 2.5, "output": 10.0, "cache_read": 1.25, "source": "contract"}}
    /// ```
    ///
    /// A negative or non-finite rate is an error; nothing is added when any entry is wrong.
    pub fn extend_from_json(&mut self, json: &str) -> Result<(), serde_json::Error> {
        use serde::de::Error as _;
        let extra: HashMap<String, Price> = serde_json::from_str(json)?;
        for (name, p) in &extra {
            let rates = [Some(p.input), Some(p.output), p.cache_read, p.cache_write];
            if rates.iter().flatten().any(|r| !r.is_finite() || *r < 0.0) {
                return Err(serde_json::Error::custom(format!(
                    "the price of `{name}` has a negative rate; rates are US dollars per million tokens"
                )));
            }
        }
        self.prices.extend(extra);
        Ok(())
    }
}

const BUILTIN_AS_OF: &str = "2026-11-21";
const OPENAI: &str = "https://openai.com/api/pricing";
const ANTHROPIC: &str = "https://docs.anthropic.com/en/docs/about-claude/pricing";
const GEMINI: &str = "https://ai.google.dev/gemini-api/docs/pricing";

type HandRow = (
    &'static str,
    f64,
    f64,
    Option<f64>,
    Option<f64>,
    &'static str,
);

/// name, input, output, cache read, cache write, source.
const BUILTIN: &[HandRow] = &[
    ("gpt-5", 1.25, 10.0, Some(0.125), None, OPENAI),
    ("gpt-5-mini", 0.25, 2.0, Some(0.025), None, OPENAI),
    ("gpt-5-nano", 0.05, 0.40, Some(0.005), None, OPENAI),
    ("gpt-4.1", 2.0, 8.0, Some(0.50), None, OPENAI),
    ("gpt-4.1-mini", 0.40, 1.60, Some(0.10), None, OPENAI),
    ("gpt-4.1-nano", 0.10, 0.40, Some(0.025), None, OPENAI),
    ("gpt-4o", 2.50, 10.0, Some(1.25), None, OPENAI),
    ("gpt-4o-mini", 0.15, 0.60, Some(0.075), None, OPENAI),
    ("o3", 2.0, 8.0, Some(0.50), None, OPENAI),
    ("o4-mini", 1.10, 4.40, Some(0.275), None, OPENAI),
    ("gpt-3.5-turbo", 0.50, 1.50, None, None, OPENAI),
    (
        "claude-opus-4-1",
        15.0,
        75.0,
        Some(1.50),
        Some(18.75),
        ANTHROPIC,
    ),
    (
        "claude-opus-4",
        15.0,
        75.0,
        Some(1.50),
        Some(18.75),
        ANTHROPIC,
    ),
    (
        "claude-sonnet-4-5",
        3.0,
        15.0,
        Some(0.30),
        Some(3.75),
        ANTHROPIC,
    ),
    (
        "claude-sonnet-4",
        3.0,
        15.0,
        Some(0.30),
        Some(3.75),
        ANTHROPIC,
    ),
    (
        "claude-3-7-sonnet",
        3.0,
        15.0,
        Some(0.30),
        Some(3.75),
        ANTHROPIC,
    ),
    (
        "claude-haiku-4-5",
        1.0,
        5.0,
        Some(0.10),
        Some(1.25),
        ANTHROPIC,
    ),
    (
        "claude-3-5-haiku",
        0.80,
        4.0,
        Some(0.08),
        Some(1.0),
        ANTHROPIC,
    ),
    ("gemini-2.5-pro", 1.25, 10.0, Some(0.31), None, GEMINI),
    ("gemini-2.5-flash", 0.30, 2.50, Some(0.075), None, GEMINI),
    (
        "gemini-2.5-flash-lite",
        0.10,
        0.40,
        Some(0.025),
        None,
        GEMINI,
    ),
    ("gemini-2.0-flash", 0.10, 0.40, Some(0.025), None, GEMINI),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_model_has_unknown_cost() {
        let t = PriceTable::builtin();
        assert_eq!(t.cost("test", &Usage::default()), None);
        assert_eq!(t.cost("gpt-4oz", &Usage::default()), None);
    }

    #[test]
    fn dated_names_find_their_family_and_cache_rates_apply() {
        let t = PriceTable::builtin();
        let u = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            cache_read_tokens: 500_000,
            ..Usage::default()
        };
        let c = t.cost("openai:gpt-4o-2024-08-06", &u).unwrap();
        assert!((c - (1.25 + 0.625 + 10.0)).abs() < 1e-9, "{c}");
        // the longest prefix wins
        assert_eq!(t.get("gpt-4o-mini-2024-07-18").unwrap().input, 0.15);
    }

    #[test]
    fn users_extend_the_table() {
        let mut t = PriceTable::empty();
        t.extend_from_json(r#"{"my-model": {"input": 1.0, "output": 2.0}}"#)
            .unwrap();
        let u = Usage {
            input_tokens: 2_000_000,
            output_tokens: 1_000_000,
            ..Usage::default()
        };
        assert_eq!(t.cost("my-model", &u), Some(4.0));
    }

    #[test]
    fn the_dataset_parses_and_prices_models_the_hand_table_lacks() {
        let all = Table::<Price>::index(DATASET, &COLUMNS, 0).unwrap();
        assert!(all.rows.len() > 1000, "{}", all.rows.len());
        // Every row reads (rows are read when first found, so a bad one would only show then).
        for (name, row) in &all.rows {
            let p = all.read(row, read_price);
            assert!(
                p.is_some_and(|p| p.input >= 0.0 && p.output >= 0.0 && p.as_of == all.retrieved),
                "{name}: {p:?}"
            );
        }
        let t = PriceTable::builtin();
        // Newer and other providers' models, with and without provider prefixes.
        for name in [
            "gpt-5.1",
            "claude-opus-4-5",
            "deepseek/deepseek-chat",
            "deepseek-chat",
            "openrouter/deepseek/deepseek-chat",
            "gemini:gemini-2.5-pro",
        ] {
            let p = t.get(name).unwrap_or_else(|| panic!("{name} has no price"));
            assert!(p.input > 0.0 && p.output > 0.0, "{name}: {p:?}");
        }
        let p = t.get("claude-opus-4-5-20251101").unwrap();
        assert_eq!((p.input, p.output), (5.0, 25.0));
        assert!(p.source.contains("LiteLLM"), "{p:?}");
        // The hand-checked rows fill in what the dataset lacks.
        assert!(BUILTIN_TABLE.rows.contains_key("claude-3-5-haiku"));
    }

    #[test]
    fn entries_added_win_over_the_dataset() {
        let mut t = PriceTable::builtin();
        assert_eq!(t.get("gpt-4o").unwrap().input, 2.5);
        t.extend_from_json(r#"{"gpt-4o": {"input": 1.0, "output": 1.0}}"#)
            .unwrap();
        assert_eq!(t.get("gpt-4o-2024-08-06").unwrap().input, 1.0);
        assert_eq!(t.get("openai:gpt-4o").unwrap().input, 1.0);
        let e = t
            .extend_from_json(r#"{"x": {"input": -1.0, "output": 1.0}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
        assert!(t.get("x").is_none());
        assert!(t.extend_from_json(r#"{"x": {"input": 1.0}}"#).is_err());
    }

    #[test]
    fn unknown_models_stay_unknown_in_the_dataset_too() {
        let t = PriceTable::builtin();
        for name in [
            "my-local-model",
            "llama.cpp",
            "openrouter/nobody/none",
            "-",
            "",
        ] {
            assert!(t.get(name).is_none(), "{name}");
        }
    }
}
