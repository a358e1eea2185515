//! Prompt-based tool calling (PTK). Placeholder.
