//! The context window: what a model can take, how much the next request holds, and the error a
//! provider gives when a request does not fit.
//!
//! - [`limits`]: each model's context window and output limit, from LiteLLM's dataset, with
//!   overrides ([`LimitTable`], [`ModelLimits`]);
//! - [`estimate`]: the input tokens of the next request, from the provider's last report plus
//!   an estimate of what was added since ([`TokenEstimator`]);
//! - [`overflow`]: a provider's refusal of a request too large for the window
//!   ([`ContextOverflow`], carried by [`crate::model::ModelError::ContextOverflow`]);
//! - [`policy`]: what a run does to stay inside the window: spill, clear, compact
//!   ([`ContextPolicy`], applied by the machine, driven by the agent);
//! - [`native`]: what a provider does to the context itself, when its adapter offers it
//!   ([`NativeSupport`], [`NativeContext`], [`NativeReport`]).

pub mod driver;
pub mod estimate;
pub mod limits;
pub mod native;
pub mod overflow;
pub mod policy;

pub use estimate::TokenEstimator;
pub use limits::{LimitTable, ModelLimits};
pub use native::{NativeClear, NativeContext, NativeReport, NativeSupport};
pub use overflow::ContextOverflow;
pub use policy::ContextPolicy;
