//! Tool sources: tools that come from outside the program and can change while a run goes on
//! (an MCP server's, whose list changes when it says `notifications/tools/list_changed`).
//!
//! An agent takes sources beside its own tools ([`crate::AgentBuilder::tool_source`]). A run
//! offers the agent's tools and every source's, as listed when it starts; before each model
//! call, a source whose [`ToolSource::version`] moved is listed again, and when the catalog
//! differs the model call offers the new one and the calls it returns are checked and run
//! against it (the run's events say so: [`crate::Event::ToolsChanged`]).
//!
//! A logged run logs its catalog when it starts and each time it changes (see
//! [`crate::toolbox::CatalogEntry`]), so a replay after a crash rebuilds it with the tools it
//! had, without asking any source: a call is judged by the tool as the model was offered it
//! (its schema, whether it is read-only), and runs as the source's tool of that name runs now.
//!
//! A source whose version has not moved keeps the tools it listed; only the sources whose
//! version moved are listed again. A source that fails to list its tools keeps the ones it
//! listed last (none, if it never listed) and is asked again before the next model call; one
//! that does not answer within 30 seconds keeps them too, and is left alone for a minute unless
//! its version moves (so that a source that hangs does not hold up every round). Failures are
//! logged (`tracing`). The run's cancellation and timeout stop the wait.
//! A source's tool whose name is taken (by the agent's own tools or an earlier source's) or
//! whose schema does not compile is left out, with a warning.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use toolloop::tool::Tool;
//! use toolloop::tool_source::{ToolSource, ToolSourceError};
//!
//! /// Tools a plug-in registry hands out; `version` moves when a plug-in is added.
//! struct Plugins {
//!     version: AtomicU64,
//!     tools: std::sync::Mutex<Vec<Arc<dyn Tool>>>,
//! }
//!
//! #[async_trait::async_trait]
//! impl ToolSource for Plugins {
//!     fn name(&self) -> &str {
//!         "plugins"
//!     }
//!     fn version(&self) -> u64 {
//!         self.version.load(Ordering::SeqCst)
//!     }
//!     async fn tools(&self, _reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
//!         Ok(self.tools.lock().unwrap().clone())
//!     }
//! }
//! ```

use crate::tool::Tool;
use async_trait::async_trait;
use std::sync::Arc;

/// Tools that come from outside the program and may change during a run.
#[async_trait]
pub trait ToolSource: Send + Sync {
    /// The source's name, for messages.
    fn name(&self) -> &str;

    /// A number that changes whenever the source's tools may have changed (a server said its
    /// list changed, or was started again). Asked before every model call: it must be cheap
    /// and do no I/O.
    fn version(&self) -> u64;

    /// The source's tools now. `reserved` holds the names already taken (the agent's own
    /// tools): a source that can rename its tools (a prefix, say) avoids them; a tool that
    /// takes one anyway is left out.
    async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError>;
}

/// Why a source could not list its tools.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool source `{source_name}`: {message}")]
pub struct ToolSourceError {
    /// The source's name.
    pub source_name: String,
    /// What went wrong.
    pub message: String,
}
