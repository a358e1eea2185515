//! What the gateway (`toolloop serve --openai`, `model: "gateway:SPEC"`) adds to a request:
//! the same client request with two tools, answered by the mock's text-only mode with a call
//! written as text (`text_calls=hermes`), sent (a) through the gateway, which renders the tools
//! into the prompt, forwards, parses the call out of the text and answers with `tool_calls`, and
//! (b) straight to the mock, already rendered as the gateway renders it. Interleaved one by one
//! over one kept-alive connection each; prints both medians and the difference (the gateway's
//! added latency), then the requests per second through each with several clients at once.
//!
//! `cargo bench -p toolloop-cli --bench gateway -- [sequential requests] [clients] [seconds]`

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use toolloop::message::Message;
use toolloop::model::{ModelRequest, ModelSettings, ToolSpec};
use toolloop::providers::openai::{OpenAiConfig, build_request_body};
use toolloop::providers::test_model::TestModel;
use toolloop::ptk::{Dialect, Prompted};

const SCENARIO: &str = "mock:text_calls=hermes,rounds=1,parallel=2";

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_weather".into(),
            description: "The weather in a city.".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        },
        ToolSpec {
            name: "get_time".into(),
            description: "The time in a time zone.".into(),
            parameters: json!({"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}),
        },
    ]
}

/// The client's request to the gateway.
fn gateway_body() -> Value {
    let tools: Vec<Value> = tools()
        .iter()
        .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
        .collect();
    json!({
        "model": format!("gateway:openai:{SCENARIO}"),
        "messages": [{"role": "user", "content": "Weather and time in Paris, please."}],
        "tools": tools,
    })
}

/// The request the gateway sends the mock for it: the same conversation rendered for
/// prompt-based calling, in the OpenAI adapter's own wire format.
fn direct_body() -> Value {
    let prompted = Prompted::new(Arc::new(TestModel::new()), Dialect::Hermes);
    let messages = vec![Message::user("Weather and time in Paris, please.")];
    let tools = tools();
    let settings = ModelSettings::default();
    let request = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &tools,
        settings: &settings,
    };
    let (messages, reminders, settings) = prompted.rewrite(&request);
    let inner = ModelRequest {
        messages: (&messages).into(),
        reminders: &reminders,
        tools: &[],
        settings: &settings,
    };
    build_request_body(&inner, &OpenAiConfig::new(SCENARIO), false)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn once(client: &reqwest::Client, url: &str, body: &Value, calls_expected: bool) {
    let r = client
        .post(url)
        .json(body)
        .send()
        .await
        .expect("a response");
    assert!(r.status().is_success(), "{}", r.status());
    let v: Value = r.json().await.expect("JSON");
    let message = &v["choices"][0]["message"];
    if calls_expected {
        assert_eq!(
            message["tool_calls"].as_array().map(Vec::len),
            Some(2),
            "{v}"
        );
    } else {
        assert!(
            message["content"]
                .as_str()
                .is_some_and(|t| t.contains("<tool_call>")),
            "{v}"
        );
    }
}

async fn throughput(url: &str, body: &Value, calls: bool, clients: usize, secs: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (url, body, done) = (url.to_string(), body.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            while Instant::now() < until {
                once(&client, &url, &body, calls).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("a client");
    }
    done.load(Ordering::Relaxed) as f64 / secs as f64
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let clients: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(16);
    let secs: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mock = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .expect("the mock");
    let dir = tempfile::tempdir().expect("a directory");
    let mut server = Command::new(env!("CARGO_BIN_EXE_toolloop"))
        .args([
            "serve",
            "--openai",
            "127.0.0.1:0",
            "--base-url",
            &format!("{}/v1", mock.base_url()),
            "--dialect",
            "hermes",
            "--max-runs",
            "10000",
            "--store",
            dir.path().join("store.db").to_str().expect("a path"),
        ])
        .env("TOOLLOOP_CONFIG", "")
        .env("OPENAI_API_KEY", "bench")
        .env_remove("TOOLLOOP_MODEL")
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolloop serve");
    let stderr = server.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines.next().expect("the server's address").expect("a line");
        if let Some(at) = line.split("serving the OpenAI API on ").nth(1) {
            break at.to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let gateway = format!("{base}/chat/completions");
    let direct = format!("{}/v1/chat/completions", mock.base_url());
    let (g_body, d_body) = (gateway_body(), direct_body());
    rt.block_on(async {
        let g_client = reqwest::Client::new();
        let d_client = reqwest::Client::new();
        for _ in 0..50 {
            once(&g_client, &gateway, &g_body, true).await;
            once(&d_client, &direct, &d_body, false).await;
        }
        let (mut g, mut d) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let t = Instant::now();
            once(&g_client, &gateway, &g_body, true).await;
            g.push(t.elapsed());
            let t = Instant::now();
            once(&d_client, &direct, &d_body, false).await;
            d.push(t.elapsed());
        }
        let (gm, dm) = (median(g), median(d));
        println!(
            "sequential, {n} requests each: through the gateway {:.3} ms median, straight to the \
             mock {:.3} ms median: the gateway adds {:.3} ms",
            gm.as_secs_f64() * 1e3,
            dm.as_secs_f64() * 1e3,
            (gm.as_secs_f64() - dm.as_secs_f64()) * 1e3
        );
        let g_rps = throughput(&gateway, &g_body, true, clients, secs).await;
        let d_rps = throughput(&direct, &d_body, false, clients, secs).await;
        println!(
            "{clients} clients for {secs}s: {g_rps:.0} requests/s through the gateway, \
             {d_rps:.0} requests/s straight to the mock"
        );
    });
    let _ = server.kill();
    let _ = server.wait();
    rt.block_on(mock.shutdown());
}
