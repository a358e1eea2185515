//! What the sandbox adds to a command: `run_command` running `true` (a) outside the sandbox,
//! (b) in the default sandbox (workspace-write, no network: Landlock rules, a private TMPDIR,
//! a user and network namespace) and (c) in the sandbox with the network allowed (no
//! namespace), interleaved in rounds; and (d) `SandboxPolicy::prepare` alone (the rules and
//! the temporary directory, made before the fork). Prints the medians and the differences to
//! (a). The target is at most 5 ms per command.
//!
//! `cargo bench -p toolloop-tools --bench sandbox_setup -- [commands per round] [rounds]`
//! (Linux with Landlock and user namespaces; says so and exits elsewhere).

use serde_json::json;
use std::time::{Duration, Instant};
use toolloop::tool::{Tool, ToolContext};
use toolloop_tools::command::{CommandConfig, RunCommand};
use toolloop_tools::sandbox::{SandboxMode, SandboxPolicy};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let per_round: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(100);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let dir = std::env::temp_dir().join(format!("toolloop-sandbox-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite);
    if let Err(why) = policy.support() {
        eprintln!("sandbox_setup: no sandbox here ({why}); nothing measured");
        return;
    }
    let tool = |sandbox: SandboxPolicy| {
        let mut c = CommandConfig::new(&dir);
        c.sandbox = sandbox;
        RunCommand::new(c).expect("the tool")
    };
    let plain = tool(SandboxPolicy::off());
    let boxed = tool(policy.clone());
    let boxed_net = tool(policy.clone().network(true));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let run = |t: &RunCommand| {
        let start = Instant::now();
        let out = rt
            .block_on(t.call(
                json!({"command": ["true"]}),
                ToolContext::detached("b", "run_command"),
            ))
            .expect("the command runs");
        assert_eq!(out.data.expect("data")["exit_code"], 0);
        start.elapsed()
    };
    let spawn = |confine: Option<&SandboxPolicy>| {
        let start = Instant::now();
        let mut cmd = std::process::Command::new("true");
        cmd.current_dir(&dir);
        let conf = confine.map(|p| {
            let mut c = p.prepare(&dir).expect("prepared");
            c.apply(&mut cmd);
            c
        });
        let status = cmd.status().expect("runs");
        assert!(status.success());
        drop(conf);
        start.elapsed()
    };
    let (mut e, mut f, mut g) = (Vec::new(), Vec::new(), Vec::new());
    let net = policy.clone().network(true);
    for _ in 0..rounds * per_round {
        e.push(spawn(None));
        f.push(spawn(Some(&net)));
        g.push(spawn(Some(&policy)));
    }
    println!(
        "std::process::Command `true`: plain {:.3} ms, Landlock {:.3} ms, Landlock and namespaces {:.3} ms",
        ms(median(e)),
        ms(median(f)),
        ms(median(g))
    );
    let (mut a, mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        for _ in 0..per_round {
            a.push(run(&plain));
            b.push(run(&boxed));
            c.push(run(&boxed_net));
            let start = Instant::now();
            drop(policy.prepare(&dir).expect("prepared"));
            d.push(start.elapsed());
        }
    }
    let (a, b, c, d) = (median(a), median(b), median(c), median(d));
    println!("run_command `true`, median of {} each:", per_round * rounds);
    println!("  (a) no sandbox:                       {:.3} ms", ms(a));
    println!(
        "  (b) sandbox, no network (default):    {:.3} ms  (+{:.3} ms)",
        ms(b),
        ms(b.saturating_sub(a))
    );
    println!(
        "  (c) sandbox, network allowed:         {:.3} ms  (+{:.3} ms)",
        ms(c),
        ms(c.saturating_sub(a))
    );
    println!("  (d) prepare alone (rules + TMPDIR):   {:.3} ms", ms(d));
    let _ = std::fs::remove_dir_all(&dir);
}
