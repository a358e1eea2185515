//! Placeholder: filled in by the gemini adapter work.
