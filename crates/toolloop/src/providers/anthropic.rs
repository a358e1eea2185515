//! Placeholder: filled in by the anthropic adapter work.
