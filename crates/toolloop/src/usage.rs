//! Token usage, summed over every model call of a run.

use serde::{Deserialize, Serialize};
use std::ops::AddAssign;

/// Tokens used by one model call, or summed over several.
///
/// The meaning is the same for every provider: `input_tokens` counts every input token the
/// provider processed, including the ones read from or written to its prompt cache, which are
/// also counted in `cache_read_tokens` and `cache_write_tokens`. (Anthropic reports cache tokens
/// apart from `input_tokens`; its adapter adds them in. [`Usage::uncached_input_tokens`] gives
/// Anthropic's own figure back.) `reasoning_tokens` are part of `output_tokens` where the provider
/// counts them there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input (prompt) tokens, cached ones included.
    pub input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Input tokens written to the provider's prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Reasoning (thinking) tokens, where the provider reports them.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Input tokens that were neither read from nor written to the cache.
    pub fn uncached_input_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_sub(self.cache_read_tokens)
            .saturating_sub(self.cache_write_tokens)
    }

    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

impl AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}

/// What a tool call spent on model calls of its own: a sub-agent's run (see
/// [`crate::subagent`]). The run that made the call counts it in its own usage and cost, and
/// reports it with the call ([`crate::outcome::ExecutedCall::spent`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Spent {
    /// Who spent it: the sub-agent's path from the run that made the call (`["reviewer"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
    /// The run it was logged under, when it was logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Tokens; `None` when no model call reported usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Model calls that reported no usage.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub calls_without_usage: u32,
    /// Cost in US dollars, when the prices are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Model calls made.
    #[serde(default)]
    pub rounds: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_splits() {
        let mut u = Usage::default();
        u += Usage {
            input_tokens: 100,
            output_tokens: 5,
            cache_read_tokens: 60,
            cache_write_tokens: 10,
            reasoning_tokens: 2,
        };
        u += Usage {
            input_tokens: 1,
            output_tokens: 1,
            ..Usage::default()
        };
        assert_eq!(u.input_tokens, 101);
        assert_eq!(u.uncached_input_tokens(), 31);
        assert_eq!(u.total_tokens(), 107);
        assert_eq!(u.reasoning_tokens, 2);
    }
}
