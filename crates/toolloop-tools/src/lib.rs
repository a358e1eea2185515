//! Built-in tools for toolloop agents.
//!
//! - [`fs`]: `read_file`, `list_dir`, `search_files` and `write_file`, confined to a root
//!   directory; [`builtin_tools`] gives the set the `toolloop` command offers.
#![warn(missing_docs)]

pub mod fs;

pub use fs::builtin_tools;
