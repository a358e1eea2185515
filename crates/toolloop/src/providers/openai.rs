//! Placeholder: filled in by the openai adapter work.
