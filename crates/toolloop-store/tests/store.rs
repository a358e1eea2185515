//! The store on SQLite, and on PostgreSQL when `TOOLLOOP_TEST_POSTGRES` names a database
//! (`.ci/run` always sets it; without it the PostgreSQL half is skipped with a note).

#[path = "../../toolloop/tests/common/mod.rs"]
mod common;
use common::script;

/// The charge agent of the shared fixture, with a side-effecting tool.
fn agent(model: ScriptedModel, journal: Arc<dyn Journal>, effects: common::Effects) -> Agent {
    common::agent(model, journal, effects, SideEffect::SideEffecting)
}

use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolloop::agent::Agent;
use toolloop::journal::{Journal, JournalError, Record, new_run_id};
use toolloop::message::{AssistantMessage, Message, ToolCall, ToolResult};
use toolloop::model::ModelResponse;
use toolloop::outcome::{CallStatus, StopReason};
use toolloop::providers::scripted::ScriptedModel;
use toolloop::tool::SideEffect;
use toolloop_store::{RunStatus, RunTags, Store};

/// The stores to test: a fresh SQLite file, and PostgreSQL when configured.
async fn stores(dir: &tempfile::TempDir) -> Vec<(&'static str, Store)> {
    let path = dir.path().join("nested").join("store.db");
    let mut out = vec![(
        "sqlite",
        Store::open(path.to_str().unwrap())
            .await
            .expect("sqlite opens"),
    )];
    match std::env::var("TOOLLOOP_TEST_POSTGRES") {
        Ok(url) if !url.trim().is_empty() => out.push((
            "postgres",
            Store::open(&url)
                .await
                .expect("TOOLLOOP_TEST_POSTGRES opens"),
        )),
        _ => eprintln!("note: TOOLLOOP_TEST_POSTGRES is not set; PostgreSQL store tests skipped"),
    }
    out
}

/// The same store opened again, as another process would (PostgreSQL's location hides the
/// password, so its URL comes from the environment again).
async fn another_process(kind: &str, store: &Store) -> Store {
    let location = if kind == "sqlite" {
        store.location().to_string()
    } else {
        std::env::var("TOOLLOOP_TEST_POSTGRES").unwrap()
    };
    Store::open(&location).await.unwrap()
}

/// A name unique to this test process and call, so tests can share one PostgreSQL database.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", new_run_id())
}

#[tokio::test]
async fn a_logged_run_is_listed_with_its_session_and_its_log_replays() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let session = unique("s");
        let started = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = started.clone();
        let tags = RunTags {
            session: Some(session.clone()),
            session_revision: None,
            meta: Some(json!({"model": "scripted"})),
            on_started: Some(Arc::new(move |id: &str| {
                seen.lock().unwrap().push(id.into())
            })),
        };
        let effects = Arc::new(Mutex::new(HashMap::new()));
        let out = agent(
            ScriptedModel::new(script()),
            store.run_journal(tags),
            effects.clone(),
        )
        .prompt("charge")
        .await;
        assert_eq!(out.stop_reason, StopReason::Answered, "{kind}");
        let run_id = out.run_id.clone().unwrap();
        assert_eq!(*started.lock().unwrap(), vec![run_id.clone()], "{kind}");
        store.save_outcome(&run_id, &out).await.unwrap();

        let records = store.load(&run_id).await.unwrap();
        assert!(
            matches!(records.first(), Some(Record::Started { .. })),
            "{kind}"
        );
        assert!(matches!(records.last(), Some(Record::Finished)), "{kind}");
        let runs = store.runs(Some(&session)).await.unwrap();
        assert_eq!(runs.len(), 1, "{kind}");
        assert_eq!(runs[0].run_id, run_id);
        assert_eq!(runs[0].status, RunStatus::Finished, "{kind}");
        assert_eq!(runs[0].stop_reason, Some(StopReason::Answered), "{kind}");
        assert_eq!(runs[0].records, records.len() as i64, "{kind}");
        assert!(runs[0].holder.is_none(), "{kind}: the lease was released");
        let (s, meta) = store.run_tags(&run_id).await.unwrap().unwrap();
        assert_eq!(s.as_deref(), Some(session.as_str()));
        assert_eq!(meta, Some(json!({"model": "scripted"})));

        // The session holds the transcript; a second run continues it.
        let mut messages = store.session_messages(&session).await.unwrap();
        assert_eq!(messages, out.messages, "{kind}");
        messages.push(Message::user("again"));
        let out2 = agent(
            ScriptedModel::new(vec![ModelResponse::text("done again")]),
            store.run_journal(RunTags::session(session.clone())),
            effects.clone(),
        )
        .run(messages)
        .await;
        store
            .save_outcome(out2.run_id.as_deref().unwrap(), &out2)
            .await
            .unwrap();
        let shown = store.session(&session).await.unwrap().unwrap();
        assert_eq!(shown.summary.runs, 2, "{kind}");
        assert_eq!(shown.summary.message_count, out2.messages.len() as i64);
        assert!(shown.repairs.is_empty());
        assert!(
            store
                .sessions()
                .await
                .unwrap()
                .iter()
                .any(|s| s.name == session && s.runs == 2)
        );
        // A finished run resumes to the same outcome, running nothing again.
        let again = agent(
            ScriptedModel::new(vec![]),
            Arc::new(store.clone()),
            effects.clone(),
        )
        .resume(&run_id, CancellationToken::new())
        .await
        .unwrap();
        assert_eq!(again.messages, out.messages, "{kind}");
        assert_eq!(effects.lock().unwrap().values().sum::<u32>(), 3, "{kind}");

        assert!(store.remove_session(&session).await.unwrap());
        assert!(store.session(&session).await.unwrap().is_none());
        assert!(store.runs(Some(&session)).await.unwrap().is_empty());
        assert!(matches!(
            store.load(&run_id).await,
            Err(JournalError::NotFound(_))
        ));
        assert!(!store.remove_session(&session).await.unwrap());
    }
}

#[tokio::test]
async fn a_run_cut_at_every_record_resumes_from_the_store_with_each_effect_at_most_once() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let effects = Arc::new(Mutex::new(HashMap::new()));
        let full = agent(
            ScriptedModel::new(script()),
            Arc::new(store.clone()),
            effects.clone(),
        )
        .prompt("charge")
        .await;
        let records = store.load(full.run_id.as_deref().unwrap()).await.unwrap();
        for cut in 1..records.len() {
            // A new run holding the first `cut` records: the process died right after them.
            let run_id = new_run_id();
            for r in &records[..cut] {
                store.append(&run_id, r).await.unwrap();
            }
            let effects: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
            let mut started = 0;
            for r in &records[..cut] {
                if let Record::ToolStarted { call_id, .. } = r {
                    // the call ran before the crash
                    effects
                        .lock()
                        .unwrap()
                        .insert(format!("{run_id}/{call_id}"), 1);
                    started += 1;
                }
            }
            let responded = records[..cut]
                .iter()
                .filter(|r| matches!(r, Record::ModelResponded { .. }))
                .count();
            assert_eq!(
                store
                    .runs(None)
                    .await
                    .unwrap()
                    .iter()
                    .find(|r| r.run_id == run_id)
                    .map(|r| r.status),
                if cut == records.len() {
                    Some(RunStatus::Finished)
                } else {
                    Some(RunStatus::Interrupted)
                },
                "{kind} cut {cut}"
            );
            let model = ScriptedModel::new(script()[responded.min(3)..].to_vec());
            let resumed = agent(model, Arc::new(store.clone()), effects.clone())
                .resume(&run_id, CancellationToken::new())
                .await
                .unwrap_or_else(|e| panic!("{kind} cut {cut}: {e}"));
            assert_eq!(
                resumed.stop_reason,
                StopReason::Answered,
                "{kind} cut {cut}"
            );
            for (key, n) in effects.lock().unwrap().iter() {
                assert_eq!(*n, 1, "{kind} cut {cut}: {key} happened {n} times");
            }
            let effects = effects.lock().unwrap().clone();
            for c in &resumed.tool_calls {
                let key = format!("{run_id}/{}", c.call.id);
                match c.status {
                    CallStatus::Ok => assert_eq!(effects.get(&key), Some(&1)),
                    CallStatus::Unknown => assert!(effects.contains_key(&key)),
                    other => panic!("{kind} cut {cut}: call {} ended {other:?}", c.call.id),
                }
            }
            assert!(effects.len() >= started);
            assert_eq!(
                store
                    .runs(None)
                    .await
                    .unwrap()
                    .iter()
                    .find(|r| r.run_id == run_id)
                    .map(|r| r.status),
                Some(RunStatus::Finished),
                "{kind} cut {cut}"
            );
        }
    }
}

#[tokio::test]
async fn a_live_lease_excludes_others_and_an_expired_one_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let run_id = new_run_id();
        store.acquire(&run_id, "holder A").await.unwrap();
        // Taking it again as the same holder is fine; anyone else is refused.
        store.acquire(&run_id, "holder A").await.unwrap();
        let err = store.acquire(&run_id, "holder B").await.unwrap_err();
        match &err {
            JournalError::Locked { holder, .. } => {
                assert!(holder.contains("holder A"), "{kind}: {err}")
            }
            other => panic!("{kind}: {other}"),
        }
        assert!(err.to_string().contains("held by another process"));
        store.release(&run_id, "holder A").await.unwrap();
        store.acquire(&run_id, "holder B").await.unwrap();
        store.release(&run_id, "holder B").await.unwrap();

        // A holder whose renewals stop (its store is gone) loses the lease when it expires;
        // this process is alive, so only the expiry frees it.
        let short = another_process(kind, &store)
            .await
            .with_lease_ttl(Duration::from_millis(400));
        let run_id = new_run_id();
        short.acquire(&run_id, "short-lived").await.unwrap();
        short
            .append(
                &run_id,
                &Record::Started {
                    messages: vec![],
                    output_schema: None,
                },
            )
            .await
            .unwrap();
        // Renewed while it lives:
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            matches!(
                store.acquire(&run_id, "taker").await,
                Err(JournalError::Locked { .. })
            ),
            "{kind}: a renewed lease holds"
        );
        drop(short);
        tokio::time::sleep(Duration::from_millis(600)).await;
        store.acquire(&run_id, "taker").await.unwrap();
        assert_eq!(
            store.run(&run_id).await.unwrap().unwrap().status,
            RunStatus::Running,
            "{kind}"
        );
        store.release(&run_id, "taker").await.unwrap();
    }
}

#[tokio::test]
async fn a_holder_that_lost_its_lease_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let stale = another_process(kind, &store).await;
        let run2 = new_run_id();
        stale.acquire(&run2, "stale").await.unwrap();
        stale
            .append(
                &run2,
                &Record::Started {
                    messages: vec![],
                    output_schema: None,
                },
            )
            .await
            .unwrap();
        // Another process frees the lease (as when it expired) and takes the run.
        store.release(&run2, "stale").await.unwrap();
        store.acquire(&run2, "thief").await.unwrap();
        let err = stale
            .append(&run2, &Record::ModelRequested { round: 1 })
            .await
            .unwrap_err();
        assert!(matches!(err, JournalError::Locked { .. }), "{kind}: {err}");
        assert!(err.to_string().contains("thief"), "{kind}: {err}");
        assert_eq!(store.load(&run2).await.unwrap().len(), 1, "{kind}");
        store.release(&run2, "thief").await.unwrap();

        // A process whose lease went while it was not writing, and that takes the run back
        // later under another holder, writes after what the other process wrote meanwhile (its
        // writer does not go by the last record it wrote itself).
        let run3 = new_run_id();
        stale.acquire(&run3, "old").await.unwrap();
        let started = Record::Started {
            messages: vec![],
            output_schema: None,
        };
        stale.append(&run3, &started).await.unwrap();
        store.release(&run3, "old").await.unwrap();
        store.acquire(&run3, "thief").await.unwrap();
        let asked = |round| Record::ModelRequested { round };
        store.append(&run3, &asked(1)).await.unwrap();
        store.release(&run3, "thief").await.unwrap();
        stale.acquire(&run3, "back").await.unwrap();
        stale.append(&run3, &asked(2)).await.unwrap();
        assert_eq!(
            store.load(&run3).await.unwrap(),
            [started, asked(1), asked(2)],
            "{kind}"
        );
        stale.release(&run3, "back").await.unwrap();
    }
}

#[tokio::test]
async fn a_new_runs_lease_is_written_with_its_first_records_and_a_racer_is_refused_there() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        // A fresh id taken without a lookup (`acquire_new`, as a run with an id of its own
        // does) is refused to another holder of this process, and races another process's as
        // an id looked up does.
        let fresh = new_run_id();
        store.acquire_new(&fresh, "first").await.unwrap();
        store.acquire_new(&fresh, "first").await.unwrap();
        assert!(
            matches!(
                store.acquire_new(&fresh, "second").await,
                Err(JournalError::Locked { .. })
            ),
            "{kind}"
        );
        store.release(&fresh, "first").await.unwrap();
        let other = another_process(kind, &store).await;
        for looked_up in [true, false] {
            // Two processes start a run with the same id: neither has written, so both take it.
            let run_id = new_run_id();
            if looked_up {
                store.acquire(&run_id, "first").await.unwrap();
                other.acquire(&run_id, "second").await.unwrap();
            } else {
                store.acquire_new(&run_id, "first").await.unwrap();
                other.acquire_new(&run_id, "second").await.unwrap();
            }
            // Nothing is written until the run's first records: no lease, no run.
            assert!(store.run(&run_id).await.unwrap().is_none(), "{kind}");
            let started = Record::Started {
                messages: vec![Message::user("one")],
                output_schema: None,
            };
            store.append(&run_id, &started).await.unwrap();
            // The lease came with the records, so the racer's first write is refused.
            let run = store.run(&run_id).await.unwrap().unwrap();
            assert_eq!(run.status, RunStatus::Running, "{kind}");
            let err = other.append(&run_id, &started).await.unwrap_err();
            assert!(matches!(err, JournalError::Locked { .. }), "{kind}: {err}");
            assert!(err.to_string().contains("first"), "{kind}: {err}");
            assert!(
                matches!(
                    other.acquire(&run_id, "second").await,
                    Err(JournalError::Locked { .. })
                ),
                "{kind}: the racer cannot take the run while its holder lives"
            );
            assert_eq!(store.load(&run_id).await.unwrap().len(), 1, "{kind}");
            // Giving the run back frees it for anyone.
            store.release(&run_id, "first").await.unwrap();
            other.acquire(&run_id, "second").await.unwrap();
            other
                .append(&run_id, &Record::ModelRequested { round: 1 })
                .await
                .unwrap();
            assert_eq!(store.load(&run_id).await.unwrap().len(), 2, "{kind}");
            other.release(&run_id, "second").await.unwrap();
        }

        // A run given back before it wrote anything leaves nothing behind.
        let unused = new_run_id();
        store.acquire(&unused, "first").await.unwrap();
        store.release(&unused, "first").await.unwrap();
        assert!(store.run(&unused).await.unwrap().is_none(), "{kind}");
        other.acquire(&unused, "second").await.unwrap();
        other.release(&unused, "second").await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_checkpoints_a_sqlite_log_into_the_database_file_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let store = Store::open(path.to_str().unwrap()).await.unwrap();
    let empty = std::fs::metadata(&path).unwrap().len();
    // Some 6 MB of records, in appends of 20.
    let body = "x".repeat(1000);
    let run_id = new_run_id();
    store.acquire(&run_id, "writer").await.unwrap();
    let started = Record::Started {
        messages: vec![Message::user("go")],
        output_schema: None,
    };
    store.append(&run_id, &started).await.unwrap();
    let step: Vec<Record> = (0..20)
        .map(|i| Record::StopChecked {
            round: i,
            signal: Some(body.clone()),
        })
        .collect();
    for _ in 0..300 {
        store.append_all(&run_id, &step).await.unwrap();
    }
    // A connection checkpoints on its own only past 64 MiB of log: without the writer's
    // checkpoints the database file would keep its size until the store closed.
    let mut grown = 0;
    for _ in 0..100 {
        grown = std::fs::metadata(&path).unwrap().len();
        if grown > empty + 4_000_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        grown > empty + 4_000_000,
        "the database file grew from {empty} to only {grown} bytes"
    );
    assert_eq!(store.load(&run_id).await.unwrap().len(), 6001);
    store.release(&run_id, "writer").await.unwrap();
}

#[tokio::test]
async fn a_broken_stored_transcript_loads_repaired() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let session = unique("broken");
        let call = ToolCall {
            id: "c1".into(),
            name: "charge".into(),
            arguments: json!({}),
            invalid_arguments: None,
            provider_data: None,
        };
        let broken = vec![
            Message::user("charge"),
            Message::Assistant(AssistantMessage {
                text: None,
                tool_calls: vec![call],
                parts: vec![],
            }),
            Message::Tool(ToolResult {
                call_id: "zz".into(),
                name: "charge".into(),
                content: "orphan".into(),
                is_error: false,
                images: Vec::new(),
            }),
        ];
        store.save_session(&session, &broken).await.unwrap();
        let loaded = store.session(&session).await.unwrap().unwrap();
        assert_eq!(loaded.repairs.len(), 2, "{kind}: {:?}", loaded.repairs);
        assert_eq!(loaded.messages.len(), 3);
        let Message::Tool(r) = &loaded.messages[2] else {
            panic!("{kind}: {:?}", loaded.messages)
        };
        assert_eq!(r.call_id, "c1");
        assert!(r.is_error);
        assert_eq!(
            store.session_messages(&session).await.unwrap(),
            loaded.messages
        );
        assert!(
            store
                .session_messages(&unique("none"))
                .await
                .unwrap()
                .is_empty()
        );
        store.remove_session(&session).await.unwrap();
    }
}

#[tokio::test]
async fn bad_locations_fail_with_a_clear_error() {
    let err = Store::open("").await.unwrap_err().to_string();
    assert!(err.contains("empty path"), "{err}");
    postgres_locations_fail_with_a_clear_error().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let err = Store::open(file.join("db").to_str().unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot open the store"), "{err}");
}

/// A `postgres://` location that cannot be a store: a server of another protocol, a refused
/// port.
#[cfg(feature = "postgres")]
async fn postgres_locations_fail_with_a_clear_error() {
    // A server that is not PostgreSQL: it answers the client's first message with bytes of
    // another protocol.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let not_postgres = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut first = [0u8; 8];
            let _ = socket.read_exact(&mut first).await;
            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let err = Store::open(&format!("postgres://nobody:secret@127.0.0.1:{port}/none"))
        .await
        .unwrap_err()
        .to_string();
    not_postgres.abort();
    assert!(err.contains("cannot open the store"), "{err}");
    assert!(!err.contains("secret"), "the password is hidden: {err}");
    // A refused connection is reported at once, with its cause, not after the pool's retries.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let started = std::time::Instant::now();
    let err = Store::open(&format!("postgres://nobody:secret@127.0.0.1:{port}/none"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot open the store"), "{err}");
    assert!(err.to_lowercase().contains("refused"), "{err}");
    assert!(!err.contains("secret"), "the password is hidden: {err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "a refused connection took {:?} to report (the pool retries for 15 s)",
        started.elapsed()
    );
}

/// Without PostgreSQL support, a `postgres://` location is refused with the feature to add.
#[cfg(not(feature = "postgres"))]
async fn postgres_locations_fail_with_a_clear_error() {
    let err = Store::open("postgres://nobody:secret@127.0.0.1:1/none")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("feature `postgres`"), "{err}");
    assert!(!err.contains("secret"), "the password is hidden: {err}");
}

#[tokio::test]
async fn a_run_never_overwrites_a_turn_saved_after_it_started() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let session = unique("cas");
        let effects = Arc::new(Mutex::new(HashMap::new()));
        // Two runs start from the same (empty) session.
        let tags = || RunTags {
            session_revision: Some(0),
            ..RunTags::session(session.clone())
        };
        let first = agent(
            ScriptedModel::new(vec![ModelResponse::text("one")]),
            store.run_journal(tags()),
            effects.clone(),
        )
        .prompt("first")
        .await;
        let second = agent(
            ScriptedModel::new(vec![ModelResponse::text("two")]),
            store.run_journal(tags()),
            effects.clone(),
        )
        .prompt("second")
        .await;
        let (a, b) = (
            first.run_id.clone().unwrap(),
            second.run_id.clone().unwrap(),
        );
        store.save_outcome(&b, &second).await.unwrap();
        let err = store.save_outcome(&a, &first).await.unwrap_err();
        assert!(
            matches!(&err, toolloop_store::StoreError::SessionMoved { run_id, .. } if *run_id == a),
            "{kind}: {err}"
        );
        assert_eq!(
            store.session_messages(&session).await.unwrap(),
            second.messages,
            "{kind}"
        );
        // Continuing the first run is refused for the same reason; the second is fine.
        assert!(store.check_resume(&a).await.is_err(), "{kind}");
        store.check_resume(&b).await.unwrap();
        // Saving a recorded run again changes nothing.
        store.save_outcome(&b, &first).await.unwrap();
        assert_eq!(
            store.session_messages(&session).await.unwrap(),
            second.messages,
            "{kind}"
        );
        let shown = store.session(&session).await.unwrap().unwrap();
        assert_eq!(shown.summary.revision, 1, "{kind}");
    }
}

/// Two processes on one SQLite file: a run's outcome (its stop reason, and its turn of the
/// session) is saved while the other process holds the write lock, once the other commits,
/// instead of failing with "database is locked".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_is_saved_while_another_process_writes_to_the_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let (kind, store) = stores(&dir).await.remove(0);
    let session = unique("busy");
    let out = agent(
        ScriptedModel::new(vec![ModelResponse::text("one")]),
        store.run_journal(RunTags {
            session_revision: Some(0),
            ..RunTags::session(session.clone())
        }),
        Arc::new(Mutex::new(HashMap::new())),
    )
    .prompt("first")
    .await;
    let run_id = out.run_id.clone().unwrap();
    // The other process has written, and commits a moment later.
    let mut other = hold_writes(kind, store.location()).await;
    sqlx::raw_sql("CREATE TABLE another_process (x INTEGER)")
        .execute(&mut other)
        .await
        .unwrap();
    let commit = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::raw_sql("COMMIT").execute(&mut other).await.unwrap();
    };
    let (saved, ()) = tokio::join!(store.save_outcome(&run_id, &out), commit);
    saved.unwrap();
    assert_eq!(
        store.session_messages(&session).await.unwrap(),
        out.messages
    );
    let run = store.runs(Some(&session)).await.unwrap();
    assert_eq!(run[0].status, RunStatus::Finished);
}

#[tokio::test]
async fn a_session_is_held_by_one_holder_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let session = unique("held");
        store.lock_session(&session, "worker a").await.unwrap();
        let err = store.lock_session(&session, "worker b").await.unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("session `{session}` is in use by worker a on ")),
            "{kind}: {err}"
        );
        store.unlock_session(&session, "worker a").await.unwrap();
        store.lock_session(&session, "worker b").await.unwrap();
        store.unlock_session(&session, "worker b").await.unwrap();
    }
}

#[tokio::test]
async fn an_in_memory_store_keeps_runs_and_sessions() {
    let store = Store::open(":memory:").await.unwrap();
    let session = unique("mem");
    let out = agent(
        ScriptedModel::new(vec![ModelResponse::text("hi")]),
        store.run_journal(RunTags::session(session.clone())),
        Arc::new(Mutex::new(HashMap::new())),
    )
    .prompt("hello")
    .await;
    assert_eq!(out.stop_reason, StopReason::Answered);
    store
        .save_outcome(out.run_id.as_deref().unwrap(), &out)
        .await
        .unwrap();
    assert_eq!(
        store.session_messages(&session).await.unwrap(),
        out.messages
    );
    assert_eq!(store.runs(None).await.unwrap().len(), 1);
}

/// The kinds of a run's records, in order.
fn kinds(records: &[Record]) -> Vec<&'static str> {
    records.iter().map(Record::kind).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_share_the_writer_and_every_log_is_whole_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    // What one run writes, alone.
    let memory = Arc::new(toolloop::journal::MemoryJournal::new());
    let alone = agent(ScriptedModel::new(script()), memory.clone(), Arc::default())
        .prompt("charge")
        .await;
    let expected = kinds(&memory.load(alone.run_id.as_deref().unwrap()).await.unwrap());
    let mut all = stores(&dir).await;
    // PostgreSQL with four transactions side by side, as well as its default two.
    if let Some((_, pg)) = all.iter().find(|(kind, _)| *kind == "postgres") {
        let four = pg.clone().with_writers(4);
        all.push(("postgres, 4 writers", four));
    }
    for (kind, store) in all {
        let runs = 300;
        let effects: common::Effects = Arc::default();
        let outcomes = futures::future::join_all((0..runs).map(|_| {
            let a = agent(
                ScriptedModel::new(script()),
                Arc::new(store.clone()),
                effects.clone(),
            );
            tokio::spawn(async move { a.prompt("charge").await })
        }))
        .await;
        let effects = effects.lock().unwrap().clone();
        assert_eq!(effects.len(), runs * 3, "{kind}");
        assert!(effects.values().all(|n| *n == 1), "{kind}");
        for outcome in outcomes {
            let outcome = outcome.unwrap();
            assert_eq!(outcome.stop_reason, StopReason::Answered, "{kind}");
            let run_id = outcome.run_id.clone().unwrap();
            let records = store.load(&run_id).await.unwrap();
            assert_eq!(kinds(&records), expected, "{kind}: {run_id}");
            let summary = store.run(&run_id).await.unwrap().unwrap();
            assert_eq!(summary.records as usize, records.len(), "{kind}");
            assert_eq!(summary.status, RunStatus::Finished, "{kind}");
            // The log replays to the run's outcome.
            let again = agent(
                ScriptedModel::new(vec![]),
                Arc::new(store.clone()),
                Arc::default(),
            )
            .resume(&run_id, CancellationToken::new())
            .await
            .unwrap();
            assert_eq!(again.messages, outcome.messages, "{kind}");
        }
        // The runs shared commits.
        let stats = store.writer_stats();
        assert!(
            stats.commits > 0 && stats.appends > stats.commits && stats.failures == 0,
            "{kind}: {stats:?}"
        );
    }
}

/// Answers with a `charge` call carrying `marker` once `gate` lets it, then with text.
struct Gated {
    gate: Arc<tokio::sync::Semaphore>,
    called: Arc<std::sync::atomic::AtomicUsize>,
    marker: String,
}

#[async_trait::async_trait]
impl toolloop::model::Model for Gated {
    fn name(&self) -> &str {
        "gated"
    }
    async fn complete(
        &self,
        request: &toolloop::model::ModelRequest<'_>,
    ) -> Result<ModelResponse, toolloop::model::ModelError> {
        if request
            .messages
            .iter()
            .any(|m| matches!(m, Message::Assistant(_)))
        {
            return Ok(ModelResponse::text("done"));
        }
        self.called
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.gate.acquire().await.unwrap().forget();
        Ok(ModelResponse::tool_calls(vec![ToolCall::new(
            "charge",
            json!({"amount": 1, "note": self.marker}),
        )]))
    }
}

/// Holds the store's write lock from another connection until dropped (SQLite: a write
/// transaction; PostgreSQL: the run-log table locked against inserts).
async fn hold_writes(kind: &str, location: &str) -> sqlx::AnyConnection {
    sqlx::any::install_default_drivers();
    let url = if kind == "sqlite" {
        format!("sqlite://{location}")
    } else {
        location.to_string()
    };
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let lock = if kind == "sqlite" {
        "BEGIN IMMEDIATE"
    } else {
        "BEGIN; LOCK TABLE toolloop_log IN SHARE MODE"
    };
    sqlx::raw_sql(lock).execute(&mut conn).await.unwrap();
    conn
}

/// Makes inserting a record whose body holds `marker` fail.
async fn poison(kind: &str, location: &str, marker: &str) {
    sqlx::any::install_default_drivers();
    let url = if kind == "sqlite" {
        format!("sqlite://{location}")
    } else {
        location.to_string()
    };
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let name = marker.replace('-', "_");
    let sql = if kind == "sqlite" {
        format!(
            "CREATE TRIGGER {name} BEFORE INSERT ON toolloop_log \
             WHEN NEW.body LIKE '%{marker}%' BEGIN SELECT RAISE(ABORT, 'poisoned record'); END"
        )
    } else {
        format!(
            "CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN \
             IF NEW.body LIKE '%{marker}%' THEN RAISE EXCEPTION 'poisoned record'; END IF; \
             RETURN NEW; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER {name} BEFORE INSERT ON toolloop_log \
             FOR EACH ROW EXECUTE FUNCTION {name}()"
        )
    };
    sqlx::raw_sql(&sql).execute(&mut conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_fails_every_run_of_its_batch_and_none_of_them_acts() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let location = if kind == "sqlite" {
            store.location().to_string()
        } else {
            std::env::var("TOOLLOOP_TEST_POSTGRES").unwrap()
        };
        // One transaction at a time (PostgreSQL commits two side by side by default, each with
        // its own runs), so that the nine runs share one.
        let store = store.with_writers(1);
        let marker = unique("poison").replace("poison-run_", "poison_");
        poison(kind, &location, &marker).await;
        // Run 0 goes first; then 9 more, one of them with a record the database refuses.
        let first = Arc::new(tokio::sync::Semaphore::new(0));
        let rest = Arc::new(tokio::sync::Semaphore::new(0));
        let called = Arc::new(AtomicUsize::new(0));
        let effects: common::Effects = Arc::default();
        let runs: Vec<_> = (0..10)
            .map(|i| {
                let model = Gated {
                    gate: if i == 0 { first.clone() } else { rest.clone() },
                    called: called.clone(),
                    marker: if i == 5 {
                        marker.clone()
                    } else {
                        format!("run {i}")
                    },
                };
                let a = Agent::builder(model)
                    .tool(common::Charge::new(
                        effects.clone(),
                        SideEffect::SideEffecting,
                    ))
                    .journal(Arc::new(store.clone()))
                    .build()
                    .unwrap();
                tokio::spawn(async move { a.prompt("charge").await })
            })
            .collect();
        // Every run has started (its first record is committed) and waits on its model.
        while called.load(Ordering::SeqCst) < 10 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let lock = hold_writes(kind, &location).await;
        // Run 0's step is taken alone, and waits for the lock; the other nine gather behind it.
        first.add_permits(1);
        tokio::time::sleep(Duration::from_millis(400)).await;
        rest.add_permits(9);
        tokio::time::sleep(Duration::from_millis(400)).await;
        drop(lock);
        let mut outcomes = Vec::new();
        for r in runs {
            outcomes.push(r.await.unwrap());
        }
        assert_eq!(
            outcomes[0].stop_reason,
            StopReason::Answered,
            "{kind}: {:?}",
            outcomes[0].error
        );
        let effects = effects.lock().unwrap().clone();
        let run0 = outcomes[0].run_id.clone().unwrap();
        assert_eq!(effects.len(), 1, "{kind}: only run 0 acted: {effects:?}");
        assert!(effects.keys().all(|k| k.starts_with(&run0)), "{kind}");
        for (i, o) in outcomes.iter().enumerate().skip(1) {
            assert_eq!(o.stop_reason, StopReason::StoreFailed, "{kind}: run {i}");
            let message = &o.error.as_ref().unwrap().message;
            assert!(
                message.contains("poisoned record"),
                "{kind}: run {i}: {message}"
            );
            // Nothing of the failed step was written: the log holds the start alone.
            let records = store.load(o.run_id.as_deref().unwrap()).await.unwrap();
            assert_eq!(kinds(&records), ["started"], "{kind}: run {i}");
        }
    }
}

/// A raw connection to the store's database (for what the API does not show).
async fn raw(kind: &str, store: &Store) -> sqlx::AnyConnection {
    sqlx::any::install_default_drivers();
    let url = if kind == "sqlite" {
        format!("sqlite://{}", store.location())
    } else {
        std::env::var("TOOLLOOP_TEST_POSTGRES").unwrap()
    };
    <sqlx::AnyConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_step_is_one_row_read_back_in_order_and_rows_of_one_record_still_load() {
    use sqlx::Row;
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let out = agent(
            ScriptedModel::new(script()),
            Arc::new(store.clone()),
            Arc::default(),
        )
        .prompt("charge")
        .await;
        assert_eq!(out.stop_reason, StopReason::Answered, "{kind}");
        let run_id = out.run_id.clone().unwrap();
        let records = store.load(&run_id).await.unwrap();
        let mut conn = raw(kind, &store).await;
        let select = query_for(
            kind,
            "SELECT seq, kind, body FROM toolloop_log WHERE run_id = ? ORDER BY seq",
        );
        let rows: Vec<(i64, String, String)> = sqlx::query(&select)
            .bind(&run_id)
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        // Fewer rows than records: a step's records share one row, its body an array of them
        // and its kind theirs, numbered with the sequence number of its first record.
        assert!(rows.len() < records.len(), "{kind}: {} rows", rows.len());
        let mut next = 1;
        let mut read = Vec::new();
        for (seq, row_kind, body) in &rows {
            assert_eq!(*seq, next, "{kind}");
            let row: Vec<Record> = if body.starts_with('[') {
                serde_json::from_str(body).unwrap()
            } else {
                vec![serde_json::from_str(body).unwrap()]
            };
            assert_eq!(row_kind, &kinds(&row).join(","), "{kind}");
            next += row.len() as i64;
            read.extend(row);
        }
        assert!(
            rows.iter().any(|(_, _, b)| b.starts_with('[')),
            "{kind}: some row holds several records"
        );
        assert_eq!(read, records, "{kind}: the rows hold the records, in order");
        let summary = store.run(&run_id).await.unwrap().unwrap();
        assert_eq!(summary.records, next - 1, "{kind}");

        // A log written a record per row (as before rows held a step's records) still loads,
        // and takes more records after its last.
        let old = new_run_id();
        let (insert_run, insert_record) = if kind == "sqlite" {
            (
                "INSERT INTO toolloop_runs (run_id, records, finished, created_ms, updated_ms) \
                 VALUES (?, ?, FALSE, 0, 0)",
                "INSERT INTO toolloop_records (run_id, seq, kind, body, created_ms) \
                 VALUES (?, ?, ?, ?, 0)",
            )
        } else {
            (
                "INSERT INTO toolloop_runs (run_id, records, finished, created_ms, updated_ms) \
                 VALUES ($1, $2, FALSE, 0, 0)",
                "INSERT INTO toolloop_records (run_id, seq, kind, body, created_ms) \
                 VALUES ($1, $2, $3, $4, 0)",
            )
        };
        let cut = records.len() - 1;
        sqlx::query(insert_run)
            .bind(&old)
            .bind(cut as i64)
            .execute(&mut conn)
            .await
            .unwrap();
        for (i, r) in records[..cut].iter().enumerate() {
            sqlx::query(insert_record)
                .bind(&old)
                .bind(i as i64 + 1)
                .bind(r.kind())
                .bind(serde_json::to_string(r).unwrap())
                .execute(&mut conn)
                .await
                .unwrap();
        }
        assert_eq!(store.load(&old).await.unwrap(), records[..cut], "{kind}");
        store.append_all(&old, &records[cut..]).await.unwrap();
        assert_eq!(store.load(&old).await.unwrap(), records, "{kind}");
        let summary = store.run(&old).await.unwrap().unwrap();
        assert_eq!(summary.records, records.len() as i64, "{kind}");
        assert_eq!(summary.status, RunStatus::Finished, "{kind}");
    }
}

/// A SQLite store's writer is a thread: it keeps committing, and answering, for runs on a
/// runtime other than the one it was started from, after that one has gone.
#[test]
fn a_sqlite_store_outlives_the_runtime_that_started_its_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runtimes.db");
    let started = Record::Started {
        messages: vec![Message::user("go")],
        output_schema: None,
    };
    let first = tokio::runtime::Runtime::new().unwrap();
    let store = first.block_on(async {
        let store = Store::open(path.to_str().unwrap()).await.unwrap();
        let run_id = new_run_id();
        store.acquire_new(&run_id, "first").await.unwrap();
        store.append(&run_id, &started).await.unwrap();
        store
    });
    drop(first);
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        // Many runs at once, so that the writer's batches hold several.
        let runs: Vec<_> = (0..50)
            .map(|i| {
                let store = store.clone();
                let started = started.clone();
                tokio::spawn(async move {
                    let run_id = new_run_id();
                    let holder = format!("holder {i}");
                    store.acquire_new(&run_id, &holder).await?;
                    store.append(&run_id, &started).await?;
                    store
                        .append(&run_id, &Record::ModelRequested { round: 1 })
                        .await
                })
            })
            .collect();
        for run in runs {
            run.await.unwrap().expect("committed and answered");
        }
    });
}

/// A query's text for the database: `?` placeholders on SQLite, `$1`, `$2`, … on PostgreSQL.
fn query_for(kind: &str, sql: &str) -> String {
    if kind == "sqlite" {
        return sql.to_string();
    }
    let mut n = 0;
    sql.chars()
        .map(|c| {
            if c == '?' {
                n += 1;
                format!("${n}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[tokio::test]
async fn the_log_is_written_in_order_each_run_linked_and_read_back_by_its_links() {
    use sqlx::Row;
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let mut conn = raw(kind, &store).await;
        let session = unique("linked");
        let journal = store.run_journal(RunTags::session(session.clone()));
        let step = |round| {
            vec![
                Record::ModelRequested { round },
                Record::StopChecked {
                    round,
                    signal: None,
                },
            ]
        };
        // Two runs going on at once, their steps interleaved.
        let runs = [new_run_id(), new_run_id()];
        for (i, run) in runs.iter().enumerate() {
            journal
                .acquire_new(run, &format!("holder {i}"))
                .await
                .unwrap();
            let started = Record::Started {
                messages: vec![Message::user("go")],
                output_schema: None,
            };
            journal.append(run, &started).await.unwrap();
        }
        for round in 1..=3 {
            for run in &runs {
                journal.append_all(run, &step(round)).await.unwrap();
            }
        }
        let rows = query_for(
            kind,
            "SELECT id, seq, prev FROM toolloop_log WHERE run_id = ? ORDER BY id",
        );
        for run in &runs {
            let got: Vec<(i64, i64, Option<i64>)> = sqlx::query(&rows)
                .bind(run)
                .fetch_all(&mut conn)
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            // A row per step, numbered by its first record, each linked to the one before.
            assert_eq!(
                got.iter().map(|r| r.1).collect::<Vec<_>>(),
                [1, 2, 4, 6],
                "{kind}"
            );
            assert_eq!(got[0].2, None, "{kind}");
            for pair in got.windows(2) {
                assert_eq!(pair[1].2, Some(pair[0].0), "{kind}");
            }
            // The run's tail: its last row and record, which the listing shows.
            let tail: (i64, i64) = sqlx::query(&query_for(
                kind,
                "SELECT last_id, last_seq FROM toolloop_log_tails WHERE run_id = ?",
            ))
            .bind(run)
            .fetch_one(&mut conn)
            .await
            .map(|r| (r.get(0), r.get(1)))
            .unwrap();
            assert_eq!(tail, (got[3].0, 7), "{kind}");
            let summary = store.run(run).await.unwrap().unwrap();
            assert_eq!(summary.records, 7, "{kind}");
            assert_eq!(summary.status, RunStatus::Running, "{kind}");
            assert!(summary.updated_ms >= summary.created_ms, "{kind}");
            assert_eq!(store.load(run).await.unwrap().len(), 7, "{kind}");
        }
        // Their rows are in the order they were written: the two runs' interleaved.
        let order: Vec<String> = sqlx::query(&query_for(
            kind,
            "SELECT run_id FROM toolloop_log WHERE run_id = ? OR run_id = ? ORDER BY id",
        ))
        .bind(&runs[0])
        .bind(&runs[1])
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
        assert_eq!(
            order,
            [0, 1, 0, 1, 0, 1, 0, 1].map(|i| runs[i].clone()),
            "{kind}"
        );

        // The end: the run row takes the count and the last row; the tail goes.
        journal.append(&runs[0], &Record::Finished).await.unwrap();
        journal.release(&runs[0], "holder 0").await.unwrap();
        let tails: i64 = sqlx::query(&query_for(
            kind,
            "SELECT COUNT(*) FROM toolloop_log_tails WHERE run_id = ?",
        ))
        .bind(&runs[0])
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
        assert_eq!(tails, 0, "{kind}");
        let summary = store.run(&runs[0]).await.unwrap().unwrap();
        assert_eq!(
            (summary.records, summary.status),
            (8, RunStatus::Finished),
            "{kind}"
        );
        let records = store.load(&runs[0]).await.unwrap();
        assert_eq!(records.len(), 8, "{kind}");
        assert!(matches!(records.last(), Some(Record::Finished)), "{kind}");

        // Removing the session removes both runs' rows and tails (one of them still going).
        assert!(store.remove_session(&session).await.unwrap());
        for run in &runs {
            for table in ["toolloop_log", "toolloop_log_tails"] {
                let left: i64 = sqlx::query(&query_for(
                    kind,
                    &format!("SELECT COUNT(*) FROM {table} WHERE run_id = ?"),
                ))
                .bind(run)
                .fetch_one(&mut conn)
                .await
                .unwrap()
                .get(0);
                assert_eq!(left, 0, "{kind}: {table}");
            }
        }

        // A row lost from the middle of a run's log is found, not skipped.
        let run = new_run_id();
        store.acquire_new(&run, "holder").await.unwrap();
        let started = Record::Started {
            messages: vec![Message::user("go")],
            output_schema: None,
        };
        store.append(&run, &started).await.unwrap();
        for round in 1..=3 {
            store.append_all(&run, &step(round)).await.unwrap();
        }
        sqlx::query(&query_for(
            kind,
            "DELETE FROM toolloop_log WHERE run_id = ? AND seq = 2",
        ))
        .bind(&run)
        .execute(&mut conn)
        .await
        .unwrap();
        let err = store.load(&run).await.unwrap_err();
        assert!(
            matches!(err, JournalError::Corrupt { .. }) && err.to_string().contains("record 4"),
            "{kind}: {err}"
        );
        store.release(&run, "holder").await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_store_has_committed_everything() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, store) in stores(&dir).await {
        let run_id = new_run_id();
        store.acquire_new(&run_id, "closing").await.unwrap();
        let started = Record::Started {
            messages: vec![Message::user("go")],
            output_schema: None,
        };
        store.append(&run_id, &started).await.unwrap();
        // Handed to the writer, not waited for: committed by the close all the same.
        let behind = Arc::new(store.clone()).append_behind(
            &run_id,
            vec![Record::ModelRequested { round: 1 }, Record::Finished],
        );
        store.close().await;
        behind.await.unwrap();
        let err = store
            .append(&run_id, &Record::ModelRequested { round: 2 })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("closed"), "{kind}: {err}");
        let again = another_process(kind, &store).await;
        assert_eq!(again.load(&run_id).await.unwrap().len(), 3, "{kind}");
        again.close().await;
    }
}

/// The length of a SQLite store's log (WAL) file and its inode; `None` when there is none.
fn log_file(store: &Store) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(format!("{}-wal", store.location())).ok()?;
    Some((m.len(), m.ino()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_sqlite_store_keeps_a_short_log_for_the_next_process_and_copies_a_long_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("closing.db");
    let path = path.to_str().unwrap();
    let started = Record::Started {
        messages: vec![Message::user("go")],
        output_schema: None,
    };
    // A process that makes one run: its short log stays, with what it committed.
    let first = Store::open(path).await.unwrap();
    let database = || std::fs::metadata(path).unwrap().len();
    let made = database();
    let run_id = new_run_id();
    first.acquire_new(&run_id, "first").await.unwrap();
    first.append(&run_id, &started).await.unwrap();
    first.append(&run_id, &Record::Finished).await.unwrap();
    first.close().await;
    let (kept, inode) = log_file(&first).expect("the short log is kept");
    assert!(kept > 0 && kept < 1 << 20, "{kept} bytes");
    // The next process reads it, and writes on in the same log (not a new one, whose creation
    // and header the disk would sync) and leaves it again.
    let second = Store::open(path).await.unwrap();
    assert_eq!(second.load(&run_id).await.unwrap().len(), 2);
    let next = new_run_id();
    second.acquire_new(&next, "second").await.unwrap();
    second.append(&next, &started).await.unwrap();
    second.close().await;
    let (grown, same) = log_file(&second).expect("the log is kept again");
    assert_eq!(same, inode, "the log was made anew");
    assert!(
        grown > kept,
        "the log did not grow: {kept} then {grown} bytes"
    );
    // Nothing was copied into the database: neither process checkpointed (not at its first
    // commit, not at its close), so neither synced the disk for it.
    assert_eq!(database(), made, "a checkpoint ran");
    // Past 1 MiB of log, the last connection to close copies it in and removes it, so no
    // process reads more than that through when it opens the store.
    let third = Store::open(path).await.unwrap();
    let long = new_run_id();
    third.acquire_new(&long, "third").await.unwrap();
    let body = "x".repeat(1000);
    let step: Vec<Record> = (0..20)
        .map(|i| Record::StopChecked {
            round: i,
            signal: Some(body.clone()),
        })
        .collect();
    for _ in 0..60 {
        third.append_all(&long, &step).await.unwrap();
    }
    assert!(log_file(&third).is_some_and(|(len, _)| len >= 1 << 20));
    third.close().await;
    // Copied in and cut to nothing, then removed by the last connection to close. (sqlx may
    // finish closing one of its pool's connections just after `close` returns; that one then
    // closes last, and removes the empty log a moment later.)
    let left = log_file(&third);
    assert!(
        left.is_none_or(|(len, _)| len == 0),
        "the long log is left: {left:?}"
    );
    let fourth = Store::open(path).await.unwrap();
    assert_eq!(fourth.load(&run_id).await.unwrap().len(), 2);
    assert_eq!(fourth.load(&next).await.unwrap().len(), 1);
    assert_eq!(fourth.load(&long).await.unwrap().len(), 1200);
    fourth.close().await;
}
