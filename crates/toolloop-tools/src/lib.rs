//! Built-in tools for toolloop agents.
//!
//! - [`fs`]: `read_file`, `list_dir`, `search_files` and `write_file`, confined to a root
//!   directory; [`builtin_tools`] gives the set the `toolloop` command offers.
//! - [`command`]: `run_command`, a program run in the root with a timeout, a capped output,
//!   a scrubbed environment and its own process group.
#![warn(missing_docs)]

pub mod command;
pub mod fs;

pub use fs::builtin_tools;
