//! toolloop as a durable service on [Restate](https://restate.dev).
//!
//! An [`Agent`](toolloop::Agent) served here is a Restate virtual object named
//! [`SERVICE`] (`toolloop`), keyed by run id: each run is one invocation of its `run`
//! handler. The handler drives the loop's [`Machine`](toolloop::engine::Machine) step by
//! step, and each step from outside is a journaled `ctx.run` whose value is the machine's
//! [`Input`](toolloop::engine::Input), the same value a run log holds: every model call (its
//! response with its calls' approval subjects), every tool call, the hooks' answers, a changed
//! tool catalog. When a worker dies, Restate sends the invocation to another
//! worker, which replays the journal: the machine is rebuilt from the journaled results and no
//! finished model call or tool call is made again. A side-effecting call that was running at
//! the crash is not run again either: its intent is journaled first, and the model reads
//! "outcome unknown" (unless the agent's `on_in_flight` handler asks for a retry).
//!
//! A sub-agent's call ([`toolloop::subagent::SubAgent`]) is a child invocation of the same
//! object, keyed `{run id}/{call id}`, which runs the sub-agent's own machine the same way:
//! Restate journals the call in the parent, so a parent replayed on another worker takes the
//! child's result (or waits for the same child) instead of starting it again, and a child
//! whose worker dies is replayed from its own journal. The child's time is bounded by the
//! parent's deadline, its token and cost budgets hold, the depth cap
//! ([`toolloop::subagent::Delegation::max_depth`]) is checked before it starts, and its calls
//! that wait for a person are listed (with [`PendingApproval::path`](toolloop::approval::PendingApproval::path))
//! and decided through its root run. The calls of one round run one after another here,
//! children included.
//!
//! Calls that wait for a person ([`Step::Approve`](toolloop::engine::Step::Approve)) become
//! Restate awakeables: [`client::pending`] lists them, [`client::decide`] resolves them
//! (or `POST /restate/awakeables/{id}/resolve` on the ingress). Restate's cancel stops the run
//! at its next step (at once when it waits for an approval) and the handler returns the run's
//! transcript with the stop reason `cancelled`.
//!
//! - [`worker`]: serve agents ([`worker::serve`]) on an HTTP/2 endpoint that the Restate server
//!   calls, and register it with the admin API ([`worker::register`]).
//! - [`client`]: start runs over Restate's HTTP ingress ([`client::invoke`]), decide approvals,
//!   cancel.
//! - [`service`]: the virtual object and its driver.

#![forbid(unsafe_code)]

pub mod client;
pub mod service;
pub mod worker;

pub use client::{ClientError, invoke};
pub use service::{ParentRun, RunRequest, RunService, SERVICE, WaitingApproval};
pub use worker::{Worker, register, serve};
