//! File-system tools confined to a root. Placeholder.
