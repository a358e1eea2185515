//! Built-in tools.

pub mod fs;
