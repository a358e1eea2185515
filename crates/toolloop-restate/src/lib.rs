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
pub use service::{RunRequest, RunService, SERVICE, WaitingApproval};
pub use worker::{Worker, register, serve};
