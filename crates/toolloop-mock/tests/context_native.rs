//! Provider-native context management behind the same context policy, over real HTTP against
//! the mock, streamed and not: Anthropic Messages clears old tool results itself
//! (`context_management`, beta header), the Responses API compacts the conversation itself
//! (`compaction` items sent back, nothing before the latest). A 300-round run with 2 KB results
//! fits an 8,000-token window; what the provider reports is logged with each response.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use toolloop::Message;
use toolloop::agent::AgentBuilder;
use toolloop::config::LoopConfig;
use toolloop::context::ContextPolicy;
use toolloop::engine::Input;
use toolloop::event::Event;
use toolloop::journal::{Journal, MemoryJournal};
use toolloop::model::Model;
use toolloop::outcome::StopReason;
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::transport::http::{HttpTransport, RetryPolicy};
use toolloop_mock::{MockOptions, start};

fn transport() -> HttpTransport {
    let mut t = HttpTransport::new();
    t.retry = RetryPolicy {
        max_retries: 2,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
    };
    t
}

fn anthropic(base: &str, scenario: &str) -> AnthropicModel {
    let mut c = AnthropicConfig::new(scenario);
    c.base_url = base.into();
    c.transport = transport();
    AnthropicModel::new(c)
}

fn responses(base: &str, scenario: &str) -> ResponsesModel {
    let mut c = ResponsesConfig::new(scenario).with_base_url(format!("{base}/v1"));
    c.transport = transport();
    ResponsesModel::new(c)
}

/// A tool whose every result is `bytes` long.
fn big_results(bytes: usize) -> impl toolloop::tool::Tool {
    tool_fn(
        "fetch",
        "Fetches a page.",
        move |_: serde_json::Value, ctx: ToolContext| async move {
            let head = format!("page for call {}: ", ctx.call_id);
            Ok::<_, ToolError>(ToolOutput::text(format!(
                "{head}{}",
                &"lorem ipsum ".repeat(bytes / 12 + 1)[..bytes - head.len()]
            )))
        },
    )
}

fn config(rounds: u32, stream: bool) -> LoopConfig {
    LoopConfig {
        max_rounds: rounds + 10,
        max_tool_calls: rounds + 10,
        detect_duplicates: false,
        stream,
        ..LoopConfig::default()
    }
}

/// What one run did.
struct Ran {
    outcome: toolloop::outcome::Outcome,
    /// `context_edited_by_provider` events.
    events: u64,
    /// Responses the journal logged with the provider's report.
    logged: u64,
}

async fn run(model: Arc<dyn Model>, rounds: u32, window: u64, stream: bool) -> Ran {
    let journal = Arc::new(MemoryJournal::new());
    let events = Arc::new(AtomicU64::new(0));
    let seen = events.clone();
    let agent = AgentBuilder::new(model)
        .tool(big_results(2048))
        .config(config(rounds, stream))
        .context(ContextPolicy {
            window: Some(window),
            ..ContextPolicy::default()
        })
        .journal(journal.clone())
        .on_event(move |e| {
            if let Event::ContextEditedByProvider { report, .. } = e {
                assert!(
                    report.cleared_tool_uses > 0 || report.compacted,
                    "{report:?}"
                );
                seen.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build()
        .unwrap();
    let outcome = agent.prompt("Fetch the pages, one per round.").await;
    let run_id = outcome.run_id.clone().expect("a logged run");
    let logged = journal
        .load(&run_id)
        .await
        .unwrap()
        .iter()
        .filter(|r| {
            matches!(r, Input::ModelResponded { response, .. } if response.context_edited.is_some())
        })
        .count() as u64;
    Ran {
        outcome,
        events: events.load(Ordering::Relaxed),
        logged,
    }
}

fn finished(ran: &Ran, rounds: u32, label: &str) {
    let o = &ran.outcome;
    assert_eq!(
        o.stop_reason,
        StopReason::Answered,
        "{label}: {:?}",
        o.error
    );
    assert_eq!(o.rounds, rounds + 1, "{label}");
    assert_eq!(
        o.text.as_deref(),
        Some(format!("Done. I saw {rounds} tool results in {rounds} rounds.").as_str()),
        "{label}"
    );
    // The transcript keeps every result whole.
    let whole = o
        .messages
        .iter()
        .filter(|m| matches!(m, Message::Tool(r) if r.content.len() >= 2048))
        .count();
    assert_eq!(whole, rounds as usize, "{label}");
}

/// Anthropic: the provider clears old results (the machine sends them whole and clears none
/// itself); when that is not enough (the calls themselves pile up), the machine still
/// summarises. No request is refused, and each clearing the mock applied was reported, told
/// as an event and logged with its response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_clears_old_results_itself_in_an_8000_token_window() {
    const ROUNDS: u32 = 300;
    const WINDOW: u64 = 8000;
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let scenario = format!("mock:rounds={ROUNDS},window={WINDOW}");
    for stream in [false, true] {
        let label = format!("stream={stream}");
        let before = server.stats();
        let ran = run(
            Arc::new(anthropic(&base, &scenario)),
            ROUNDS,
            WINDOW,
            stream,
        )
        .await;
        finished(&ran, ROUNDS, &label);
        let after = server.stats();
        assert_eq!(after.context_refusals, before.context_refusals, "{label}");
        assert_eq!(after.rejected, before.rejected, "{label}");
        let clears = after.native_clears - before.native_clears;
        assert!(clears > ROUNDS as u64 / 2, "{label}: {clears} clearings");
        assert_eq!(ran.events, clears, "{label}");
        assert_eq!(ran.logged, clears, "{label}");
        // The machine cleared nothing itself: the view's results that are still there are
        // whole (the summaries replaced the older ones).
        let ctx = ran.outcome.context.as_ref().expect("the policy's report");
        assert!(
            ran.outcome
                .view()
                .iter()
                .all(|m| !matches!(m, Message::Tool(r) if r.content.len() < 2048)),
            "{label}"
        );
        let summaries = after.summaries - before.summaries;
        assert_eq!(summaries, u64::from(ctx.compactions), "{label}");
        assert_eq!(
            after.requests - before.requests,
            u64::from(ROUNDS) + 1 + summaries,
            "{label}"
        );
    }
    server.shutdown().await;
}

/// The Responses API: the provider compacts the conversation at the threshold; the machine
/// makes no summarising call; the compaction items are kept with their turns, and nothing
/// before the latest is sent again (the mock counts what it gets: no request over the window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_compacts_itself_in_an_8000_token_window() {
    const ROUNDS: u32 = 300;
    const WINDOW: u64 = 8000;
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let scenario = format!("mock:rounds={ROUNDS},window={WINDOW}");
    for stream in [false, true] {
        let label = format!("stream={stream}");
        let before = server.stats();
        let ran = run(
            Arc::new(responses(&base, &scenario)),
            ROUNDS,
            WINDOW,
            stream,
        )
        .await;
        finished(&ran, ROUNDS, &label);
        let after = server.stats();
        assert_eq!(after.context_refusals, before.context_refusals, "{label}");
        assert_eq!(after.rejected, before.rejected, "{label}");
        assert_eq!(
            after.summaries, before.summaries,
            "{label}: no summarising call"
        );
        let compactions = after.native_compactions - before.native_compactions;
        // The machine still clears old results (in batches): the provider compacts when that
        // is not enough.
        assert!(compactions >= 2, "{label}: {compactions} compactions");
        assert_eq!(ran.events, compactions, "{label}");
        assert_eq!(ran.logged, compactions, "{label}");
        let kept = ran
            .outcome
            .messages
            .iter()
            .filter(|m| {
                matches!(m, Message::Assistant(a)
                    if a.parts.iter().any(|p| p.data["type"] == "compaction"))
            })
            .count() as u64;
        assert_eq!(
            kept, compactions,
            "{label}: compaction items kept with their turns"
        );
        assert_eq!(
            after.requests - before.requests,
            u64::from(ROUNDS) + 1,
            "{label}"
        );
    }
    server.shutdown().await;
}

/// With `native` off, the same run on the Responses API is the machine's own: summaries, no
/// compaction by the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_off_leaves_the_stages_to_the_machine() {
    const ROUNDS: u32 = 300;
    const WINDOW: u64 = 8000;
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let scenario = format!("mock:rounds={ROUNDS},window={WINDOW}");
    for model in [
        Arc::new(responses(&base, &scenario)) as Arc<dyn Model>,
        Arc::new(anthropic(&base, &scenario)),
    ] {
        let agent = AgentBuilder::new(model)
            .tool(big_results(2048))
            .config(config(ROUNDS, false))
            .context(ContextPolicy {
                window: Some(WINDOW),
                native: false,
                ..ContextPolicy::default()
            })
            .build()
            .unwrap();
        let outcome = agent.prompt("Fetch the pages, one per round.").await;
        assert_eq!(
            outcome.stop_reason,
            StopReason::Answered,
            "{:?}",
            outcome.error
        );
    }
    let stats = server.stats();
    assert_eq!(stats.native_clears + stats.native_compactions, 0);
    assert!(stats.summaries >= 2, "{}", stats.summaries);
    assert_eq!(stats.context_refusals, 0);
    server.shutdown().await;
}

/// Forwards to a model, recording what each request asked of the provider and whether its
/// conversation held a compaction item.
struct Recording<M> {
    inner: M,
    /// Per request: what it asked of the provider, its compaction items, its messages.
    seen: std::sync::Mutex<Vec<(Option<toolloop::context::NativeContext>, usize, usize)>>,
}

impl<M: Model> Recording<M> {
    fn record(&self, request: &toolloop::model::ModelRequest<'_>) {
        let compactions = request
            .messages
            .iter()
            .filter(|m| {
                matches!(m, Message::Assistant(a)
                    if a.parts.iter().any(|p| p.data["type"] == "compaction"))
            })
            .count();
        self.seen.lock().unwrap().push((
            request.settings.context,
            compactions,
            request.messages.len(),
        ));
    }
}

#[async_trait::async_trait]
impl<M: Model> Model for Recording<M> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn complete(
        &self,
        request: &toolloop::model::ModelRequest<'_>,
    ) -> Result<toolloop::model::ModelResponse, toolloop::model::ModelError> {
        self.record(request);
        self.inner.complete(request).await
    }
    async fn stream(
        &self,
        request: &toolloop::model::ModelRequest<'_>,
    ) -> Result<toolloop::model::EventStream, toolloop::model::ModelError> {
        self.record(request);
        self.inner.stream(request).await
    }
    fn native_context(&self) -> toolloop::context::NativeSupport {
        self.inner.native_context()
    }
}

/// A run cut short by a crash after its provider compacted, then resumed from its log: from
/// the crash on, the resumed run sends what the whole run sent (the same request field, the
/// same compaction items, the same number of messages), and the mock goes on from the
/// compaction items (the task ends after as many rounds in all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_sends_what_it_would_have_sent() {
    const ROUNDS: u32 = 240;
    const CRASH: u32 = 160;
    const WINDOW: u64 = 8000;
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let scenario = format!("mock:rounds={ROUNDS},window={WINDOW}");
    let agent = |journal: Arc<MemoryJournal>| {
        let model = Arc::new(Recording {
            inner: responses(&base, &scenario),
            seen: Default::default(),
        });
        let agent = AgentBuilder::new(model.clone() as Arc<dyn Model>)
            .tool(big_results(2048))
            .config(config(ROUNDS, false))
            .context(ContextPolicy {
                window: Some(WINDOW),
                ..ContextPolicy::default()
            })
            .journal(journal)
            .build()
            .unwrap();
        (agent, model)
    };
    let whole_log = Arc::new(MemoryJournal::new());
    let (whole, whole_model) = agent(whole_log.clone());
    let outcome = whole.prompt("Fetch the pages, one per round.").await;
    assert_eq!(
        outcome.stop_reason,
        StopReason::Answered,
        "{:?}",
        outcome.error
    );
    let run_id = outcome.run_id.clone().unwrap();
    let records = whole_log.load(&run_id).await.unwrap();
    // The crash: the log holds everything up to round CRASH's response.
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
    let (resuming, resumed_model) = agent(crashed_log);
    let resumed = resuming
        .resume(&run_id, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        resumed.stop_reason,
        StopReason::Answered,
        "{:?}",
        resumed.error
    );
    assert_eq!(
        resumed.text.as_deref(),
        Some(format!("Done. I saw {ROUNDS} tool results in {ROUNDS} rounds.").as_str())
    );
    let whole_sent = whole_model.seen.lock().unwrap().clone();
    let resumed_sent = resumed_model.seen.lock().unwrap().clone();
    assert_eq!(resumed_sent.len(), (ROUNDS - CRASH + 1) as usize);
    assert!(
        resumed_sent[0].1 >= 1,
        "the provider compacted before the crash, and its items are sent back"
    );
    assert_eq!(resumed_sent[..], whole_sent[CRASH as usize..]);
    assert!(
        resumed_sent
            .iter()
            .all(|s| s.0.is_some_and(|a| a.compact_at_tokens == Some(6400)))
    );
    let stats = server.stats();
    assert_eq!(stats.context_refusals, 0);
    assert_eq!(stats.rejected, 0);
    assert_eq!(stats.summaries, 0);
    server.shutdown().await;
}

/// The mock refuses what the real APIs refuse: Anthropic's `context_management` without its
/// beta header, an edit it does not know, and a Responses compaction item it did not make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_refuses_what_the_apis_refuse() {
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let http = reqwest::Client::new();
    let body = serde_json::json!({
        "model": "mock:rounds=1", "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    });
    let post = |beta: Option<&'static str>, body: serde_json::Value| {
        let mut r = http
            .post(format!("{base}/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .json(&body);
        if let Some(b) = beta {
            r = r.header("anthropic-beta", b);
        }
        r.send()
    };
    let refused = post(None, body.clone()).await.unwrap();
    assert_eq!(refused.status(), 400);
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("context-management-2025-06-27")
    );
    let ok = post(
        Some("other-beta,context-management-2025-06-27"),
        body.clone(),
    )
    .await
    .unwrap();
    assert_eq!(ok.status(), 200);
    // Under the trigger nothing is cleared, and nothing is reported.
    let message: serde_json::Value = ok.json().await.unwrap();
    assert!(message.get("context_management").is_none(), "{message}");
    let mut unknown = body.clone();
    unknown["context_management"]["edits"][0]["type"] = "clear_everything".into();
    let refused = post(Some("context-management-2025-06-27"), unknown)
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let forged = serde_json::json!({
        "model": "mock:rounds=1",
        "input": [{"type": "compaction", "id": "cmp_1", "encrypted_content": "forged"},
                  {"role": "user", "content": "hi"}],
    });
    let refused = http
        .post(format!("{base}/v1/responses"))
        .json(&forged)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("compaction"));
    server.shutdown().await;
}

/// Forwards to an Anthropic model, keeping the body of each request as the adapter builds it.
struct Bodies {
    inner: AnthropicModel,
    bodies: std::sync::Mutex<Vec<serde_json::Value>>,
}

#[async_trait::async_trait]
impl Model for Bodies {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn complete(
        &self,
        request: &toolloop::model::ModelRequest<'_>,
    ) -> Result<toolloop::model::ModelResponse, toolloop::model::ModelError> {
        let body =
            toolloop::providers::anthropic::build_request_body(request, self.inner.config(), false);
        self.bodies.lock().unwrap().push(body);
        self.inner.complete(request).await
    }
    fn native_context(&self) -> toolloop::context::NativeSupport {
        self.inner.native_context()
    }
}

/// Removes every `cache_control` marker.
fn unmarked(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => m
            .iter()
            .filter(|(k, _)| *k != "cache_control")
            .map(|(k, v)| (k.clone(), unmarked(v)))
            .collect(),
        serde_json::Value::Array(a) => a.iter().map(unmarked).collect(),
        other => other.clone(),
    }
}

/// How many requests do not start with the previous request's cached prefix (its tools, its
/// system prompt and its messages up to its last breakpoint, markers aside): the rounds whose
/// prompt cache was invalidated.
fn cache_misses(bodies: &[serde_json::Value]) -> usize {
    bodies.windows(2).filter(|w| cache_miss(w)).count()
}

/// Whether `w[1]` does not start with `w[0]`'s cached prefix.
fn cache_miss(w: &[serde_json::Value]) -> bool {
    let (before, now) = (&w[0], &w[1]);
    let messages = before["messages"].as_array().unwrap();
    let marked = messages
        .iter()
        .rposition(|m| m.to_string().contains("cache_control"))
        .unwrap();
    let now_messages = now["messages"].as_array().unwrap();
    unmarked(&before["tools"]) != unmarked(&now["tools"])
        || unmarked(&before["system"]) != unmarked(&now["system"])
        || now_messages.len() <= marked
        || unmarked(&serde_json::Value::from(messages[..=marked].to_vec()))
            != unmarked(&serde_json::Value::from(now_messages[..=marked].to_vec()))
}

/// Prompt-cache breakpoints move with the context policy rather than being invalidated every
/// round: with the machine's own clearing and summaries, a round's request starts with the
/// previous round's cached prefix except at a clearing batch (every `keep_rounds` rounds) or a
/// compaction; with the provider's own clearing, the request never changes what it sent, and
/// the provider clears the same results round after round, more only at a batch's boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_prefixes_hold_between_batches_and_move_with_compactions() {
    const ROUNDS: u32 = 120;
    const WINDOW: u64 = 8000;
    const KEEP: u32 = 4;
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let scenario = format!("mock:rounds={ROUNDS},window={WINDOW}");
    for native in [false, true] {
        let label = format!("native={native}");
        let before = server.stats();
        let model = Arc::new(Bodies {
            inner: anthropic(&base, &scenario),
            bodies: Default::default(),
        });
        let cleared = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = cleared.clone();
        let journal = Arc::new(MemoryJournal::new());
        let agent = AgentBuilder::new(model.clone() as Arc<dyn Model>)
            .journal(journal.clone())
            .tool(big_results(2048))
            .config(config(ROUNDS, false))
            .context(ContextPolicy {
                window: Some(WINDOW),
                keep_rounds: KEEP,
                native,
                ..ContextPolicy::default()
            })
            .on_event(move |e| {
                if let Event::ContextEditedByProvider { report, .. } = e {
                    seen.lock().unwrap().push(report.cleared_tool_uses);
                }
            })
            .build()
            .unwrap();
        let outcome = agent.prompt("Fetch the pages, one per round.").await;
        assert_eq!(
            outcome.stop_reason,
            StopReason::Answered,
            "{label}: {:?}",
            outcome.error
        );
        let compactions = u64::from(outcome.context.as_ref().unwrap().compactions);
        let after = server.stats();
        assert_eq!(after.context_refusals, before.context_refusals, "{label}");
        let bodies = model.bodies.lock().unwrap().clone();
        let misses = cache_misses(&bodies) as u64;
        // The clearing edits the machine logged (in batches, or under pressure).
        let edits = journal
            .load(outcome.run_id.as_deref().unwrap())
            .await
            .unwrap()
            .iter()
            .filter(|r| matches!(r, Input::ContextEdited { .. }))
            .count() as u64;
        assert!(
            edits >= u64::from(ROUNDS / KEEP) / 2,
            "{label}: {edits} edits"
        );
        // Not every round: about one per batch of rounds.
        assert!(
            edits <= u64::from(ROUNDS / KEEP) + compactions + 2,
            "{label}: {edits} edits"
        );
        // A summarising request is recorded too: it and the request after it start anew.
        if native {
            // What the request holds never changes: only a compaction moves the prefix.
            assert!(
                misses <= 2 * compactions,
                "{label}: {misses} misses, {compactions} compactions"
            );
            // The provider clears more only at a logged edit (or after a compaction).
            let cleared = cleared.lock().unwrap().clone();
            assert!(cleared.len() as u32 > ROUNDS / 2, "{label}");
            let changes = cleared.windows(2).filter(|w| w[0] != w[1]).count() as u64;
            assert!(
                changes <= edits + 2 * compactions,
                "{label}: the cleared results changed {changes} times ({edits} edits): {cleared:?}"
            );
        } else {
            assert!(compactions >= 1, "{label}");
            // A miss only at an edit or a compaction.
            assert!(
                misses <= edits + 2 * compactions,
                "{label}: {misses} misses in {} requests, {edits} edits, {compactions} \
                 compactions",
                bodies.len()
            );
        }
    }
    server.shutdown().await;
}
