//! A model or server without provider-native context management (the mock's
//! `refuse_context=true`, which answers HTTP 400 naming the field as each API does), over real
//! HTTP, streamed and not, Anthropic Messages and Responses: the adapter sends the refused
//! request again without the field, remembers the refusal for its model, and the loop clears
//! and compacts itself; the switch is logged with the response, so a resumed run sends what
//! the run would have sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use toolloop::Message;
use toolloop::agent::{Agent, AgentBuilder};
use toolloop::config::LoopConfig;
use toolloop::context::{ContextPolicy, NativeContext};
use toolloop::engine::Input;
use toolloop::event::Event;
use toolloop::journal::{Journal, MemoryJournal};
use toolloop::model::{EventStream, Model, ModelError, ModelRequest, ModelResponse};
use toolloop::outcome::StopReason;
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::transport::http::{HttpTransport, RetryPolicy};
use toolloop_mock::{MockOptions, start};

const ROUNDS: u32 = 120;
const WINDOW: u64 = 8000;

fn transport() -> HttpTransport {
    let mut t = HttpTransport::new();
    t.retry = RetryPolicy {
        max_retries: 2,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
    };
    t
}

/// A model of either API, on the mock at `base`.
fn model(api: &str, base: &str, scenario: &str) -> Arc<dyn Model> {
    if api == "anthropic" {
        let mut c = AnthropicConfig::new(scenario);
        c.base_url = base.into();
        c.transport = transport();
        Arc::new(AnthropicModel::new(c))
    } else {
        let mut c = ResponsesConfig::new(scenario).with_base_url(format!("{base}/v1"));
        c.transport = transport();
        Arc::new(ResponsesModel::new(c))
    }
}

/// Forwards to a model, recording what each request asked of the provider and how many
/// messages it sent.
struct Recording {
    inner: Arc<dyn Model>,
    seen: Mutex<Vec<(Option<NativeContext>, usize)>>,
}

impl Recording {
    fn record(&self, request: &ModelRequest<'_>) {
        self.seen
            .lock()
            .unwrap()
            .push((request.settings.context, request.messages.len()));
    }
}

#[async_trait::async_trait]
impl Model for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.record(request);
        self.inner.complete(request).await
    }
    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        self.record(request);
        self.inner.stream(request).await
    }
    fn native_context(&self) -> toolloop::context::NativeSupport {
        self.inner.native_context()
    }
}

fn agent(
    model: Arc<dyn Model>,
    stream: bool,
    journal: Arc<MemoryJournal>,
    refusals: Arc<AtomicU64>,
) -> Agent {
    AgentBuilder::new(model)
        .tool(tool_fn(
            "fetch",
            "Fetches a page.",
            |_: serde_json::Value, ctx: ToolContext| async move {
                let head = format!("page for call {}: ", ctx.call_id);
                Ok::<_, ToolError>(ToolOutput::text(format!(
                    "{head}{}",
                    &"lorem ipsum ".repeat(2048 / 12 + 1)[..2048 - head.len()]
                )))
            },
        ))
        .config(LoopConfig {
            max_rounds: ROUNDS + 10,
            max_tool_calls: ROUNDS + 10,
            detect_duplicates: false,
            stream,
            ..LoopConfig::default()
        })
        .context(ContextPolicy {
            window: Some(WINDOW),
            ..ContextPolicy::default()
        })
        .journal(journal)
        .on_event(move |e| {
            if let Event::ContextEditedByProvider { report, .. } = e {
                assert!(report.refused, "the server edits nothing: {report:?}");
                refusals.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build()
        .unwrap()
}

/// Each API, streamed and not: the first request asks for context management and is refused
/// (one 400), sent again without it; every later request asks nothing; the machine clears
/// (Anthropic) and summarises itself, so a 120-round run with 2 KB results fits the 8,000-token
/// window; the refusal is told once and logged with the response. A second run with the same
/// model asks nothing at all: the refusal is remembered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_native_context_is_dropped_and_the_loop_does_the_stages() {
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let scenario = format!("mock:rounds={ROUNDS},window={WINDOW},refuse_context=true");
    for api in ["anthropic", "responses"] {
        for stream in [false, true] {
            let label = format!("{api} stream={stream}");
            let inner = model(api, &base, &scenario);
            assert!(inner.native_context().any(), "{label}");
            let recording = Arc::new(Recording {
                inner: inner.clone(),
                seen: Mutex::default(),
            });
            let before = server.stats();
            let journal = Arc::new(MemoryJournal::new());
            let told = Arc::new(AtomicU64::new(0));
            let outcome = agent(recording.clone(), stream, journal.clone(), told.clone())
                .prompt("Fetch the pages, one per round.")
                .await;
            assert_eq!(
                outcome.stop_reason,
                StopReason::Answered,
                "{label}: {:?}",
                outcome.error
            );
            assert_eq!(
                outcome.text.as_deref(),
                Some(format!("Done. I saw {ROUNDS} tool results in {ROUNDS} rounds.").as_str()),
                "{label}"
            );
            let after = server.stats();
            assert_eq!(after.quirks - before.quirks, 1, "{label}: one refusal");
            assert_eq!(after.rejected - before.rejected, 1, "{label}");
            assert_eq!(after.context_refusals, before.context_refusals, "{label}");
            assert_eq!(
                after.native_clears + after.native_compactions,
                before.native_clears + before.native_compactions,
                "{label}"
            );
            let summaries = after.summaries - before.summaries;
            assert!(summaries >= 1, "{label}: the machine summarises itself");
            assert_eq!(
                after.requests - before.requests,
                u64::from(ROUNDS) + 1 + summaries + 1,
                "{label}: each round once, the refused request once more"
            );
            let seen = recording.seen.lock().unwrap().clone();
            assert!(seen[0].0.is_some(), "{label}: the first request asks");
            assert!(
                seen[1..].iter().all(|s| s.0.is_none()),
                "{label}: no later request asks"
            );
            assert_eq!(told.load(Ordering::Relaxed), 1, "{label}: told once");
            let logged = journal
                .load(outcome.run_id.as_deref().unwrap())
                .await
                .unwrap()
                .iter()
                .filter(|r| {
                    matches!(r, Input::ModelResponded { response, .. }
                        if response.context_edited.is_some_and(|e| e.refused))
                })
                .count();
            assert_eq!(logged, 1, "{label}: the switch is logged with its response");
            if api == "anthropic" {
                // The machine clears old results itself: the view holds stubs.
                assert!(outcome.context.is_some());
                assert!(
                    outcome
                        .view()
                        .iter()
                        .any(|m| matches!(m, Message::Tool(r) if r.content.len() < 2048)),
                    "{label}"
                );
            }
            // The same model remembers: it declares no support, and a run asks nothing.
            assert!(!inner.native_context().any(), "{label}");
            let before = server.stats();
            let told = Arc::new(AtomicU64::new(0));
            let again = agent(inner, stream, Arc::new(MemoryJournal::new()), told.clone())
                .prompt("Fetch the pages, one per round.")
                .await;
            assert_eq!(again.stop_reason, StopReason::Answered, "{label}");
            let after = server.stats();
            assert_eq!(after.quirks, before.quirks, "{label}: asked nothing");
            assert_eq!(after.rejected, before.rejected, "{label}");
            assert_eq!(told.load(Ordering::Relaxed), 0, "{label}");
        }
    }
    server.shutdown().await;
}

/// A run that met the refusal, cut short by a crash, then resumed from its log in a fresh
/// process (a new model, which knows nothing of the refusal): the resumed run asks nothing of
/// the provider and sends what the whole run sent, request for request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_after_a_refusal_sends_what_it_would_have_sent() {
    const CRASH: u32 = 70;
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let scenario = format!("mock:rounds={ROUNDS},window={WINDOW},refuse_context=true");
    for api in ["anthropic", "responses"] {
        let fresh = || {
            Arc::new(Recording {
                inner: model(api, &base, &scenario),
                seen: Mutex::default(),
            })
        };
        let whole_log = Arc::new(MemoryJournal::new());
        let whole_model = fresh();
        let outcome = agent(
            whole_model.clone(),
            false,
            whole_log.clone(),
            Arc::default(),
        )
        .prompt("Fetch the pages, one per round.")
        .await;
        assert_eq!(outcome.stop_reason, StopReason::Answered, "{api}");
        let run_id = outcome.run_id.clone().unwrap();
        let records = whole_log.load(&run_id).await.unwrap();
        let cut = records
            .iter()
            .position(|r| matches!(r, Input::ModelResponded { round, .. } if *round == CRASH))
            .unwrap()
            + 1;
        let crashed_log = Arc::new(MemoryJournal::new());
        crashed_log
            .append_all(&run_id, &records[..cut])
            .await
            .unwrap();
        let resumed_model = fresh();
        let before = server.stats();
        let resumed = agent(resumed_model.clone(), false, crashed_log, Arc::default())
            .resume(&run_id, CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(
            resumed.stop_reason,
            StopReason::Answered,
            "{api}: {:?}",
            resumed.error
        );
        assert_eq!(resumed.text, outcome.text, "{api}");
        assert_eq!(server.stats().quirks, before.quirks, "{api}: asked nothing");
        let whole_sent = whole_model.seen.lock().unwrap().clone();
        let resumed_sent = resumed_model.seen.lock().unwrap().clone();
        // The whole run's requests after the crash (summarisations included), as sent.
        let whole_after = &whole_sent[whole_sent.len() - resumed_sent.len()..];
        assert_eq!(resumed_sent, whole_after, "{api}");
        assert!(resumed_sent.len() >= (ROUNDS - CRASH) as usize, "{api}");
    }
    server.shutdown().await;
}
