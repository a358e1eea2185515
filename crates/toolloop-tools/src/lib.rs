//! Built-in tools for toolloop agents.
//!
//! - [`fs`]: `read_file`, `list_dir`, `search_files` and `write_file`, confined to a root
//!   directory; [`builtin_tools`] gives the set the `toolloop` command offers.
//! - [`command`]: `run_command`, a program run in the root with a timeout, a capped output,
//!   a scrubbed environment and its own process group, in the sandbox where the system has one.
//! - [`sandbox`]: the OS sandbox of `run_command` and of stdio MCP servers, a policy value.
// `unsafe` here is limited to the system calls of the command sandbox (`command`, `sandbox`:
// fork-to-exec steps, Landlock, namespaces); each block says why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod command;
pub mod fs;
pub mod sandbox;

pub use fs::builtin_tools;
