//! Spans for tracing tools, following the OpenTelemetry GenAI semantic conventions.
//!
//! The driver opens an `invoke_agent` span for each run, a `chat` span for each model call
//! and an `execute_tool` span for each tool call, as [`tracing`] spans with the target
//! `toolloop::genai` and `gen_ai.*` fields (operation, model, usage, finish reasons, tool name
//! and call id). Any `tracing` subscriber sees them; with `tracing-opentelemetry` they become
//! OpenTelemetry spans (the `otel.name` and `otel.kind` fields set the span's name and kind).
//! The command exports them with `--otel`.
//!
//! Message content (prompts, answers, tool arguments and results) is never a span field: it is
//! written as events with the target `toolloop::genai::content` at TRACE level, so that a
//! subscriber records it only when asked to.

use crate::message::ToolCall;
use crate::model::{FinishReason, ModelResponse};
use crate::outcome::Outcome;
use futures::future::Either;
use std::future::Future;
use tracing::instrument::{Instrument, Instrumented};
use tracing::{Span, field};

/// The target of the spans.
pub const TARGET: &str = "toolloop::genai";
/// The target of the content events.
pub const CONTENT_TARGET: &str = "toolloop::genai::content";

/// Whether entering `span` can be seen: a subscriber records it, or a `log` logger takes TRACE
/// records (with `tracing`'s `log` feature, which any crate of the program may turn on, a span
/// that no subscriber records writes its enters and exits to `log` at TRACE).
pub(crate) fn entering_matters(span: &Span) -> bool {
    !span.is_disabled() || log::max_level() >= log::LevelFilter::Trace
}

/// `fut` inside `span`, entered on each poll, when entering it can be seen
/// ([`entering_matters`]); otherwise `fut` alone, so that no poll of a run that nobody traces
/// enters and leaves its spans (a round's model call and tool calls are polled many times).
pub(crate) fn in_span<F: Future>(fut: F, span: Span) -> Either<Instrumented<F>, F> {
    if entering_matters(&span) {
        Either::Left(fut.instrument(span))
    } else {
        Either::Right(fut)
    }
}

/// The span of one run; `agent` is `toolloop` for a run of its own, or a sub-agent's name (its
/// span is then a child of the parent's `execute_tool` span, the current one when it starts).
pub(crate) fn run_span(model: &str, agent: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "invoke_agent",
        otel.name = %SpanName("invoke_agent", agent),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = agent,
        gen_ai.request.model = model,
        gen_ai.conversation.id = field::Empty,
        gen_ai.usage.input_tokens = field::Empty,
        gen_ai.usage.output_tokens = field::Empty,
        toolloop.stop_reason = field::Empty,
        toolloop.rounds = field::Empty,
        error.type = field::Empty,
    )
}

/// A span's name as OpenTelemetry's conventions write it (`chat gpt-4o`), formatted only when a
/// subscriber records the span: `tracing` evaluates a span's fields even when no subscriber
/// wants it, and a loop opens a span for every model call and every tool call.
struct SpanName<'a>(&'static str, &'a str);

impl std::fmt::Display for SpanName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

/// Records a run's end on its span.
pub(crate) fn run_finished(span: &Span, outcome: &Outcome) {
    // With no subscriber recording the span, the stop reason and error code are not named.
    if !span.is_disabled() {
        if let Some(id) = &outcome.run_id {
            span.record("gen_ai.conversation.id", id.as_str());
        }
        if let Some(u) = &outcome.usage {
            span.record("gen_ai.usage.input_tokens", u.input_tokens);
            span.record("gen_ai.usage.output_tokens", u.output_tokens);
        }
        span.record(
            "toolloop.stop_reason",
            wire_name(&outcome.stop_reason).as_str(),
        );
        span.record("toolloop.rounds", outcome.rounds);
        if let Some(e) = &outcome.error {
            span.record("error.type", wire_name(&e.code).as_str());
        }
    }
    tracing::trace!(target: CONTENT_TARGET, parent: span, answer = outcome.text.as_deref().unwrap_or_default(), "gen_ai.choice");
}

/// The name a value serializes to (a unit enum variant's), or nothing.
fn wire_name(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The span of one model call.
pub(crate) fn chat_span(model: &str, round: u32) -> Span {
    tracing::info_span!(
        target: TARGET,
        "chat",
        otel.name = %SpanName("chat", model),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.request.model = model,
        toolloop.round = round,
        gen_ai.response.finish_reasons = field::Empty,
        gen_ai.usage.input_tokens = field::Empty,
        gen_ai.usage.output_tokens = field::Empty,
        gen_ai.usage.cache_read.input_tokens = field::Empty,
        gen_ai.usage.reasoning.output_tokens = field::Empty,
        toolloop.tool_calls = field::Empty,
        error.type = field::Empty,
    )
}

/// Records a model call's result on its span.
pub(crate) fn chat_finished(span: &Span, result: &Result<ModelResponse, crate::model::ModelError>) {
    // A disabled span records nothing, but each `record` still looks its field up by name
    // (about a thousand instructions a round): skipped when no subscriber holds the span.
    let recording = !span.is_disabled();
    match result {
        Ok(r) => {
            if recording {
                span.record(
                    "gen_ai.response.finish_reasons",
                    finish_reason(r.finish_reason),
                );
                if let Some(u) = &r.usage {
                    span.record("gen_ai.usage.input_tokens", u.input_tokens);
                    span.record("gen_ai.usage.output_tokens", u.output_tokens);
                    span.record("gen_ai.usage.cache_read.input_tokens", u.cache_read_tokens);
                    span.record("gen_ai.usage.reasoning.output_tokens", u.reasoning_tokens);
                }
                span.record("toolloop.tool_calls", r.tool_calls.len());
            }
            if let Some(text) = &r.text {
                tracing::trace!(target: CONTENT_TARGET, parent: span, text = text.as_str(), "gen_ai.assistant.message");
            }
        }
        Err(e) => {
            if recording {
                span.record("error.type", error_type(e));
            }
        }
    }
}

fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Length => "length",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::MalformedToolCall => "malformed_tool_call",
        FinishReason::Error => "error",
    }
}

fn error_type(e: &crate::model::ModelError) -> &'static str {
    use crate::model::ModelError;
    match e {
        ModelError::Api(_) => "api_error",
        ModelError::Transport { .. } => "transport_error",
        ModelError::Config(_) => "config_error",
        ModelError::StreamInterrupted(_) => "stream_interrupted",
        ModelError::InvalidResponse(_) => "invalid_response",
        ModelError::BodyTooLarge { .. } => "body_too_large",
        ModelError::ToolsUnsupported(_) => "tools_unsupported",
        ModelError::ContextOverflow(_) => "context_overflow",
        ModelError::Other(_) => "model_error",
    }
}

/// The span of one tool call.
pub(crate) fn tool_span(call: &ToolCall) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = %SpanName("execute_tool", &call.name),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = call.name.as_str(),
        gen_ai.tool.call.id = call.id.as_str(),
        gen_ai.tool.type = "function",
        toolloop.attempts = field::Empty,
        error.type = field::Empty,
    );
    tracing::trace!(target: CONTENT_TARGET, parent: &span, arguments = %call.arguments, "gen_ai.tool.arguments");
    span
}

/// Records a tool call's end on its span.
pub(crate) fn tool_finished(span: &Span, success: bool, attempts: u32, result: &str) {
    // As in `chat_finished`: a disabled span's fields are not looked up.
    if !span.is_disabled() {
        span.record("toolloop.attempts", attempts);
        if !success {
            span.record("error.type", "tool_error");
        }
    }
    tracing::trace!(target: CONTENT_TARGET, parent: span, result, "gen_ai.tool.message");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    /// Keeps the `otel.name` of every span opened.
    #[derive(Clone, Default)]
    struct Names(Arc<Mutex<Vec<String>>>);

    impl tracing::field::Visit for &Names {
        fn record_debug(&mut self, field: &field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "otel.name" {
                self.0.lock().unwrap().push(format!("{value:?}"));
            }
        }
    }

    impl Subscriber for Names {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            span.record(&mut &*self);
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// A span's name and the id of the span it was opened in.
    type Opened = (&'static str, Option<u64>);

    /// Keeps each span's name and the span it was opened in (its parent), following the
    /// spans entered on the one thread the test runs on.
    #[derive(Clone, Default)]
    struct Tree {
        spans: Arc<Mutex<Vec<Opened>>>,
        entered: Arc<Mutex<Vec<u64>>>,
    }

    impl Subscriber for Tree {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            let parent = match span.parent() {
                Some(id) => Some(id.into_u64()),
                None if span.is_contextual() => self.entered.lock().unwrap().last().copied(),
                None => None,
            };
            let mut spans = self.spans.lock().unwrap();
            spans.push((span.metadata().name(), parent));
            Id::from_u64(spans.len() as u64)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, id: &Id) {
            self.entered.lock().unwrap().push(id.into_u64());
        }
        fn exit(&self, id: &Id) {
            let mut entered = self.entered.lock().unwrap();
            if let Some(at) = entered.iter().rposition(|e| *e == id.into_u64()) {
                entered.remove(at);
            }
        }
    }

    /// The driver enters a run's spans only when entering them can be seen; with a subscriber
    /// that records them it does, so that a model call's and a tool call's spans are opened
    /// inside the run's.
    #[test]
    fn a_recorded_runs_spans_are_entered_so_its_calls_spans_are_its_children() {
        use crate::model::ModelResponse;
        use crate::providers::scripted::ScriptedModel;
        use crate::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
        let tree = Tree::default();
        let model = ScriptedModel::new(vec![
            ModelResponse::tool_calls(vec![ToolCall::new("echo", serde_json::json!({}))]),
            ModelResponse::text("done"),
        ]);
        let agent = crate::Agent::builder(model)
            .tool(tool_fn(
                "echo",
                "Echoes.",
                |a: serde_json::Value, _: ToolContext| async move {
                    // The tool runs inside its call's span.
                    assert!(!Span::current().is_disabled());
                    Ok::<_, ToolError>(ToolOutput::text(a.to_string()))
                },
            ))
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let outcome = tracing::subscriber::with_default(tree.clone(), || {
            runtime.block_on(agent.prompt("go"))
        });
        assert_eq!(outcome.text.as_deref(), Some("done"));
        let spans = tree.spans.lock().unwrap().clone();
        let run = spans.iter().position(|(name, _)| *name == "invoke_agent");
        let run = run.map(|i| i as u64 + 1);
        assert!(run.is_some(), "{spans:?}");
        let children: Vec<&str> = spans
            .iter()
            .filter(|(_, parent)| *parent == run)
            .map(|(name, _)| *name)
            .collect();
        assert_eq!(children, ["chat", "execute_tool", "chat"], "{spans:?}");
    }

    /// Without a subscriber, a span is still entered where a `log` logger takes TRACE records
    /// (`tracing`'s `log` feature writes a disabled span's enters and exits there).
    #[test]
    fn a_disabled_span_is_entered_only_for_a_trace_logger() {
        let span = Span::none();
        let before = log::max_level();
        log::set_max_level(log::LevelFilter::Info);
        assert!(!entering_matters(&span));
        log::set_max_level(log::LevelFilter::Trace);
        assert!(entering_matters(&span));
        log::set_max_level(before);
        let recorded = tracing::subscriber::with_default(Tree::default(), || {
            entering_matters(&tracing::info_span!(target: TARGET, "chat"))
        });
        assert!(recorded);
    }

    #[test]
    fn spans_are_named_as_the_conventions_write_them() {
        let names = Names::default();
        let call = ToolCall::new("read_file", serde_json::json!({}));
        tracing::subscriber::with_default(names.clone(), || {
            let _ = run_span("gpt-4o", "toolloop");
            let _ = chat_span("gpt-4o", 1);
            let _ = tool_span(&call);
        });
        assert_eq!(
            *names.0.lock().unwrap(),
            [
                "invoke_agent toolloop",
                "chat gpt-4o",
                "execute_tool read_file"
            ]
        );
    }
}
