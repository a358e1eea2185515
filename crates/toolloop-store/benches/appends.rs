//! What one step's commit costs the store, in process (no model, no HTTP): a run's round is two
//! commits (the response with the call's intent, then the call's result), as the driver writes
//! them.
//!
//! Reports, per durability mode (SQLite, on the directory given, default a temporary one):
//! - µs per commit of one run appending rounds one after another, first 500 rounds vs last 500
//!   of 2,000 (a commit must not cost more as the log grows);
//! - commits/s and records/s of 1,000 runs appending rounds concurrently (group commit: their
//!   appends share transactions).
//!
//! Run: `cargo bench -p toolloop-store --bench appends [-- DIR]`; with `TOOLLOOP_BENCH_POSTGRES`
//! set to a URL, PostgreSQL is measured too.

use std::time::Instant;
use toolloop::journal::{Journal, Record, new_run_id};
use toolloop::message::{Message, ToolCall};
use toolloop::model::ModelResponse;
use toolloop::tool::ToolOutput;
use toolloop_store::{Durability, Store};

fn round_records(round: u32) -> (Vec<Record>, Vec<Record>) {
    let call = ToolCall {
        id: format!("call_{round}"),
        name: "read_file".into(),
        arguments: serde_json::json!({"path": format!("file-{round}.txt")}),
        invalid_arguments: None,
        provider_data: None,
    };
    let intent = vec![
        Record::ModelRequested { round },
        Record::ModelResponded {
            round,
            response: ModelResponse::tool_calls(vec![call.clone()]),
            cost: None,
            subjects: Vec::new(),
        },
        Record::ToolStarted {
            round,
            index: 0,
            call_id: call.id,
        },
    ];
    let result = vec![Record::ToolFinished {
        round,
        index: 0,
        result: Ok(ToolOutput::text("x".repeat(200))),
        duration_ms: 0,
        attempts: 1,
    }];
    (intent, result)
}

/// One run, `rounds` rounds; µs per commit over the first and the last `window` rounds.
async fn one_run(store: &Store, rounds: u32, window: u32) -> (f64, f64) {
    let run = new_run_id();
    store.acquire(&run, "bench").await.unwrap();
    store
        .append_all(
            &run,
            &[Record::Started {
                messages: vec![Message::user("go")],
                output_schema: None,
            }],
        )
        .await
        .unwrap();
    let mut first = 0.0;
    let mut last = 0.0;
    for round in 1..=rounds {
        let (intent, result) = round_records(round);
        let t = Instant::now();
        store.append_all(&run, &intent).await.unwrap();
        store.append_all(&run, &result).await.unwrap();
        let us = t.elapsed().as_secs_f64() * 1e6 / 2.0;
        if round <= window {
            first += us;
        } else if round > rounds - window {
            last += us;
        }
    }
    store.append_all(&run, &[Record::Finished]).await.unwrap();
    store.release(&run, "bench").await.unwrap();
    (first / window as f64, last / window as f64)
}

/// `n` runs of `rounds` rounds at once; commits (appends) per second.
async fn many_runs(store: &Store, n: usize, rounds: u32) -> (f64, f64) {
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let run = new_run_id();
                store.acquire(&run, "bench").await.unwrap();
                store
                    .append_all(
                        &run,
                        &[Record::Started {
                            messages: vec![],
                            output_schema: None,
                        }],
                    )
                    .await
                    .unwrap();
                for round in 1..=rounds {
                    let (intent, result) = round_records(round);
                    store.append_all(&run, &intent).await.unwrap();
                    store.append_all(&run, &result).await.unwrap();
                }
                store.append_all(&run, &[Record::Finished]).await.unwrap();
                store.release(&run, "bench").await.unwrap();
                let n = store.load(&run).await.unwrap().len();
                assert_eq!(n, 2 + 4 * rounds as usize, "every record of {run} is there");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let appends = (n * (2 + 2 * rounds as usize)) as f64;
    let records = (n * (2 + 4 * rounds as usize)) as f64;
    (appends / secs, records / secs)
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .filter(|a| !a.starts_with('-'))
        .map(std::path::PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    let dir = dir.unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut locations: Vec<(String, String, Durability)> = Vec::new();
        for d in [Durability::Process, Durability::PowerCut] {
            let path = dir.join(format!("appends-{}-{d:?}.db", std::process::id()));
            locations.push((
                format!("sqlite {d:?}"),
                path.to_string_lossy().into_owned(),
                d,
            ));
        }
        if let Ok(url) = std::env::var("TOOLLOOP_BENCH_POSTGRES") {
            locations.push(("postgres".into(), url, Durability::Process));
        }
        for (name, location, durability) in &locations {
            let store = Store::open_with(location, *durability).await.unwrap();
            let (first, last) = one_run(&store, 2000, 500).await;
            println!(
                "{name}: one run: {first:.1} µs per commit over the first 500 rounds, {last:.1} µs over the last 500 ({:.2}x)",
                last / first
            );
            let (commits, records) = many_runs(&store, 1000, 5).await;
            println!(
                "{name}: 1000 runs at once: {commits:.0} appends/s, {records:.0} records/s"
            );
            drop(store);
            if !location.starts_with("postgres") {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{location}{suffix}"));
                }
            }
        }
    });
}
