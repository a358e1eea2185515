//! Context management done by the provider itself (*provider-native*): what an adapter says its
//! API can do ([`NativeSupport`], from [`crate::model::Model::native_context`]), what a request
//! asks of it ([`NativeContext`], in [`crate::model::ModelSettings::context`]), and what the
//! provider reports it did ([`NativeReport`], in
//! [`crate::model::ModelResponse::context_edited`]).
//!
//! These are provider-neutral: each adapter translates a [`NativeContext`] into its API's own
//! field, and its API's report into a [`NativeReport`]. A [`crate::context::ContextPolicy`]
//! with [`native`](crate::context::ContextPolicy::native) on (the default) hands the stages
//! that the provider does to it: the machine then leaves them out of its own work (see
//! [`crate::context::policy`]).
//!
//! - Anthropic Messages: clearing of old tool results (`context_management` with a
//!   `clear_tool_uses_20250919` edit, beta `context-management-2025-06-27`);
//! - OpenAI Responses: compaction (`context_management: [{"type": "compaction",
//!   "compact_threshold": N}]`); the opaque `compaction` item it returns is kept with its turn
//!   and sent back, and the items before the latest one are no longer sent.
//!
//! A model or server without these features refuses the field (HTTP 400 naming it). The
//! adapter then sends the request again without it, remembers the refusal for that model
//! (asks nothing of it again, and declares no support from then on), warns once, and reports
//! [`NativeReport::refused`] with the response: the machine takes the stages back (its own
//! clearing and compaction) from the next round on. The report is part of the logged response,
//! so a replay or a resumed run makes the same switch at the same point and sends what the run
//! sent.

use serde::{Deserialize, Serialize};

/// What a provider's API does to the context itself, as its adapter declares it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeSupport {
    /// The API clears the results of old tool calls when asked ([`NativeClear`]).
    #[serde(default)]
    pub clear_tool_results: bool,
    /// The API compacts the conversation when asked ([`NativeContext::compact_at_tokens`]).
    #[serde(default)]
    pub compaction: bool,
}

impl NativeSupport {
    /// Whether the API does anything at all.
    pub fn any(&self) -> bool {
        self.clear_tool_results || self.compaction
    }
}

/// The clearing of old tool results a request asks of the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeClear {
    /// Clear once the request passes this many input tokens (`None`: the API's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_tokens: Option<u64>,
    /// The results of this many most recent tool calls are kept.
    pub keep_tool_uses: u32,
    /// Clear only when at least this many tokens go (so that a prompt cache is invalidated
    /// only for a gain worth it; `None`: whatever clears).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear_at_least_tokens: Option<u64>,
}

/// The context management a request asks of the provider (see the [module docs](self)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeContext {
    /// Clear old tool results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear_tool_results: Option<NativeClear>,
    /// Compact the conversation once the request passes this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_at_tokens: Option<u64>,
}

impl NativeContext {
    /// Whether the request asks for nothing.
    pub fn is_empty(&self) -> bool {
        self.clear_tool_results.is_none() && self.compact_at_tokens.is_none()
    }
}

/// What the provider reports it did to a request's context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeReport {
    /// Tool uses whose results were cleared.
    #[serde(default)]
    pub cleared_tool_uses: u64,
    /// Input tokens the clearing took out.
    #[serde(default)]
    pub cleared_input_tokens: u64,
    /// Whether the conversation was compacted (the compaction is kept with the turn, as the
    /// adapter's part, and sent back).
    #[serde(default)]
    pub compacted: bool,
    /// The server refused the context management the request asked for (a model or server
    /// without it answers HTTP 400 naming the field): the adapter sent the request again
    /// without it, and the machine does these stages itself from here on (see
    /// [`crate::context::policy`]). The adapter remembers the refusal and asks nothing of
    /// that server and model again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
}

impl NativeReport {
    /// Adds another report's figures (a provider may report several edits).
    pub fn merge(&mut self, other: NativeReport) {
        self.cleared_tool_uses = self
            .cleared_tool_uses
            .saturating_add(other.cleared_tool_uses);
        self.cleared_input_tokens = self
            .cleared_input_tokens
            .saturating_add(other.cleared_input_tokens);
        self.compacted |= other.compacted;
        self.refused |= other.refused;
    }
}
