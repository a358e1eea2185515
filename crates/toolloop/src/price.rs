//! Prices per model, and the cost of a run.
//!
//! Prices are US dollars per million tokens. A model with no price has an unknown cost (`None`),
//! never a cost of 0. The built-in table lists each entry's source and the date it was read;
//! users add or override entries with [`PriceTable::insert`].

use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

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
/// A lookup tries the exact name, then the longest entry that the name starts with followed by
/// `-` (so `gpt-4o-2024-08-06` finds `gpt-4o`), after dropping any `provider:` prefix.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PriceTable {
    prices: HashMap<String, Price>,
}

impl PriceTable {
    /// An empty table.
    pub fn empty() -> Self {
        PriceTable::default()
    }

    /// The built-in table: the current OpenAI, Anthropic and Gemini models.
    pub fn builtin() -> Self {
        let mut t = PriceTable::default();
        for (name, input, output, cache_read, cache_write, source) in BUILTIN {
            t.insert(
                *name,
                Price {
                    input: *input,
                    output: *output,
                    cache_read: *cache_read,
                    cache_write: *cache_write,
                    source: (*source).to_string(),
                    as_of: BUILTIN_AS_OF.to_string(),
                },
            );
        }
        t
    }

    /// Adds or replaces a model's price.
    pub fn insert(&mut self, model: impl Into<String>, price: Price) {
        self.prices.insert(model.into(), price);
    }

    /// The price of a model, if known.
    pub fn get(&self, model: &str) -> Option<&Price> {
        let model = model.rsplit_once(':').map_or(model, |(_, m)| m);
        if let Some(p) = self.prices.get(model) {
            return Some(p);
        }
        self.prices
            .iter()
            .filter(|(name, _)| {
                model.len() > name.len()
                    && model.starts_with(name.as_str())
                    && model.as_bytes()[name.len()] == b'-'
            })
            .max_by_key(|(name, _)| name.len())
            .map(|(_, p)| p)
    }

    /// The cost of `usage` on `model`, or `None` when the model has no price.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        self.get(model).map(|p| p.cost(usage))
    }

    /// Reads extra entries from JSON: `{"model-name": {"input": 1.0, "output": 2.0}, …}`.
    pub fn extend_from_json(&mut self, json: &str) -> Result<(), serde_json::Error> {
        let extra: HashMap<String, Price> = serde_json::from_str(json)?;
        self.prices.extend(extra);
        Ok(())
    }
}

const BUILTIN_AS_OF: &str = "2026-11-21";
const OPENAI: &str = "https://openai.com/api/pricing";
const ANTHROPIC: &str = "https://docs.anthropic.com/en/docs/about-claude/pricing";
const GEMINI: &str = "https://ai.google.dev/gemini-api/docs/pricing";

type Row = (
    &'static str,
    f64,
    f64,
    Option<f64>,
    Option<f64>,
    &'static str,
);

/// name, input, output, cache read, cache write, source.
const BUILTIN: &[Row] = &[
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
}
