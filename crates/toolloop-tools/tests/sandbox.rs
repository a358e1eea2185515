//! The command sandbox with real processes: each attack is run once outside the sandbox, where
//! it must work (so the test proves something), then inside, where it must not.
#![cfg(target_os = "linux")]

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use toolloop::approval::Action;
use toolloop::tool::{Tool, ToolContext};
use toolloop_tools::command::{CommandConfig, RunCommand};
use toolloop_tools::sandbox::{SandboxMode, SandboxPolicy};

/// A scratch place: `root` (the project), `outside` (a directory beside it, with a file
/// `victim`), and `home` (a home with a planted `.ssh/id_ed25519` and a harmless `notes`).
struct Place {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    home: PathBuf,
}

fn place() -> Place {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let (root, outside, home) = (base.join("root"), base.join("outside"), base.join("home"));
    for d in [&root, &outside, &home.join(".ssh")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(outside.join("victim"), "original").unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY").unwrap();
    std::fs::write(home.join("notes"), "just notes").unwrap();
    Place {
        _dir: dir,
        root,
        outside,
        home,
    }
}

fn policy(p: &Place, mode: SandboxMode) -> SandboxPolicy {
    SandboxPolicy {
        mode,
        network: false,
        secret_paths: SandboxPolicy::default_secret_paths(Some(&p.home)),
    }
}

fn tool(p: &Place, sandbox: SandboxPolicy) -> RunCommand {
    let mut c = CommandConfig::new(&p.root);
    c.allow_shell = true;
    c.sandbox = sandbox;
    let t = RunCommand::new(c).unwrap();
    if t.sandboxed() {
        assert!(t.sandbox_unavailable().is_none());
    }
    t
}

/// The sandboxed tool; the test fails (rather than passing vacuously) where the system
/// cannot sandbox.
fn sandboxed(p: &Place, mode: SandboxMode) -> RunCommand {
    let t = tool(p, policy(p, mode));
    assert!(
        t.sandboxed(),
        "the sandbox is unavailable here: {:?}",
        t.sandbox_unavailable()
    );
    t
}

async fn sh(t: &RunCommand, script: &str) -> Value {
    t.call(
        json!({"command": ["sh", "-c", script]}),
        ToolContext::detached("c1", "run_command"),
    )
    .await
    .unwrap()
    .data
    .unwrap()
}

fn victim(p: &Place) -> String {
    std::fs::read_to_string(p.outside.join("victim")).unwrap()
}

fn q(p: &Path) -> String {
    format!("'{}'", p.display())
}

#[tokio::test]
async fn writes_outside_the_root_are_refused_by_every_path() {
    let p = place();
    let link = p.root.join("link");
    std::os::unix::fs::symlink(&p.outside, &link).unwrap();
    let attacks = [
        format!("echo pwned > {}", q(&p.outside.join("victim"))),
        format!("echo pwned > {}", q(&link.join("victim"))),
        format!(
            "echo pwned > '/proc/self/root{}'",
            p.outside.join("victim").display()
        ),
        format!("rm {}", q(&p.outside.join("victim"))),
        format!(
            "mv {} {}",
            q(&p.outside.join("victim")),
            q(&p.root.join("v"))
        ),
    ];
    for attack in &attacks {
        std::fs::write(p.outside.join("victim"), "original").unwrap();
        let out = sh(&tool(&p, SandboxPolicy::off()), attack).await;
        assert_eq!(
            out["exit_code"], 0,
            "{attack} works without a sandbox: {out}"
        );
        assert_ne!(
            std::fs::read_to_string(p.outside.join("victim"))
                .ok()
                .as_deref(),
            Some("original"),
            "{attack}"
        );
        std::fs::write(p.outside.join("victim"), "original").unwrap();
        let out = sh(&sandboxed(&p, SandboxMode::WorkspaceWrite), attack).await;
        assert_ne!(out["exit_code"], 0, "{attack}: {out}");
        assert_eq!(victim(&p), "original", "{attack}");
        assert!(
            out["sandbox"]
                .as_str()
                .unwrap()
                .contains("\"sandbox\": false")
        );
    }
    // Within the root and the private TMPDIR, writing works.
    let t = sandboxed(&p, SandboxMode::WorkspaceWrite);
    let out = sh(
        &t,
        "echo ok > inside && cat inside && echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\"",
    )
    .await;
    assert_eq!(out["stdout"], "ok\nt\n", "{out}");
    assert!(out.get("sandbox").is_none());
}

#[tokio::test]
async fn a_hard_link_to_an_outside_file_cannot_be_made() {
    let p = place();
    let attack = format!(
        "ln {} {} && echo pwned > {}",
        q(&p.outside.join("victim")),
        q(&p.root.join("hl")),
        q(&p.root.join("hl"))
    );
    let out = sh(&tool(&p, SandboxPolicy::off()), &attack).await;
    assert_eq!(out["exit_code"], 0, "{out}");
    assert_eq!(victim(&p), "pwned\n");
    std::fs::remove_file(p.root.join("hl")).unwrap();
    std::fs::write(p.outside.join("victim"), "original").unwrap();
    let out = sh(&sandboxed(&p, SandboxMode::WorkspaceWrite), &attack).await;
    assert_ne!(out["exit_code"], 0, "{out}");
    assert!(!p.root.join("hl").exists());
    assert_eq!(victim(&p), "original");
}

#[tokio::test]
async fn a_grandchild_is_bound_too() {
    let p = place();
    let attack = format!(
        "sh -c \"sh -c 'echo pwned > {}'\"",
        p.outside.join("victim").display()
    );
    let out = sh(&tool(&p, SandboxPolicy::off()), &attack).await;
    assert_eq!(out["exit_code"], 0, "{out}");
    assert_eq!(victim(&p), "pwned\n");
    std::fs::write(p.outside.join("victim"), "original").unwrap();
    let out = sh(&sandboxed(&p, SandboxMode::WorkspaceWrite), &attack).await;
    assert_ne!(out["exit_code"], 0, "{out}");
    assert_eq!(victim(&p), "original");
}

#[tokio::test]
async fn secrets_are_not_readable_and_the_rest_is() {
    let p = place();
    let key = p.home.join(".ssh/id_ed25519");
    let attacks = [
        format!("cat {}", q(&key)),
        format!("cat '/proc/self/root{}'", key.display()),
        format!("cd {} && cat id_ed25519", q(&p.home.join(".ssh"))),
    ];
    for attack in &attacks {
        let out = sh(&tool(&p, SandboxPolicy::off()), attack).await;
        assert_eq!(out["stdout"], "PRIVATE KEY", "{attack}: {out}");
        let out = sh(&sandboxed(&p, SandboxMode::WorkspaceWrite), attack).await;
        assert_ne!(out["exit_code"], 0, "{attack}: {out}");
        assert!(
            !out["stdout"].as_str().unwrap().contains("PRIVATE"),
            "{out}"
        );
    }
    // A secret that does not exist yet is not readable once made either: its directory is
    // split, and what is created there later is not granted.
    let out = sh(
        &sandboxed(&p, SandboxMode::WorkspaceWrite),
        &format!(
            "cat {} && cat /etc/hostname >/dev/null && ls {}",
            q(&p.home.join("notes")),
            q(&p.home)
        ),
    )
    .await;
    assert_eq!(out["exit_code"], 0, "{out}");
    assert!(out["stdout"].as_str().unwrap().starts_with("just notes"));
    let late = p.home.join(".aws");
    let t = sandboxed(&p, SandboxMode::WorkspaceWrite);
    std::fs::create_dir_all(&late).unwrap();
    std::fs::write(late.join("credentials"), "AWS SECRET").unwrap();
    let out = sh(&t, &format!("cat {}", q(&late.join("credentials")))).await;
    assert_ne!(out["exit_code"], 0, "{out}");
}

#[tokio::test]
async fn read_only_mode_writes_nowhere_but_its_tmpdir() {
    let p = place();
    let t = sandboxed(&p, SandboxMode::ReadOnly);
    let out = sh(&t, "echo x > inside").await;
    assert_ne!(out["exit_code"], 0, "{out}");
    assert!(!p.root.join("inside").exists());
    let out = sh(
        &t,
        "echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo x >/dev/null",
    )
    .await;
    assert_eq!(out["stdout"], "t\n", "{out}");
    // Files keep their owner: the user is the same inside (git, ssh and others check it).
    let out = sh(&t, "id -u && stat -c %u .").await;
    let uid = std::process::Command::new("id").arg("-u").output().unwrap();
    let uid = String::from_utf8(uid.stdout).unwrap();
    assert_eq!(out["stdout"], format!("{uid}{uid}"), "{out}");
}

/// A listener on 127.0.0.1 that counts TCP connections and UDP datagrams.
struct Listener {
    port: u16,
    udp_port: u16,
    tcp: std::net::TcpListener,
    udp: std::net::UdpSocket,
}

fn listener() -> Listener {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    Listener {
        port: tcp.local_addr().unwrap().port(),
        udp_port: udp.local_addr().unwrap().port(),
        tcp,
        udp,
    }
}

impl Listener {
    fn took_tcp(&self) -> bool {
        self.tcp.accept().is_ok()
    }
    fn took_udp(&self) -> bool {
        let mut buf = [0u8; 64];
        self.udp.recv(&mut buf).is_ok()
    }
}

async fn bash(t: &RunCommand, script: &str) -> Value {
    t.call(
        json!({"command": ["bash", "-c", script]}),
        ToolContext::detached("c1", "run_command"),
    )
    .await
    .unwrap()
    .data
    .unwrap()
}

#[tokio::test]
async fn the_network_is_off_unless_allowed() {
    let p = place();
    let l = listener();
    let tcp = format!("exec 3<>/dev/tcp/127.0.0.1/{} && echo connected", l.port);
    let udp = format!("echo hi > /dev/udp/127.0.0.1/{}", l.udp_port);

    let out = bash(&tool(&p, SandboxPolicy::off()), &tcp).await;
    assert_eq!(out["stdout"], "connected\n", "{out}");
    assert!(l.took_tcp());
    bash(&tool(&p, SandboxPolicy::off()), &udp).await;
    assert!(l.took_udp());

    let t = sandboxed(&p, SandboxMode::WorkspaceWrite);
    let out = bash(&t, &tcp).await;
    assert_ne!(out["exit_code"], 0, "{out}");
    assert!(out["sandbox"].is_string(), "{out}");
    assert!(!l.took_tcp());
    bash(&t, &udp).await;
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!l.took_udp(), "a UDP datagram left the sandbox");

    let t = tool(&p, policy(&p, SandboxMode::WorkspaceWrite).network(true));
    assert!(t.sandboxed());
    let out = bash(&t, &tcp).await;
    assert_eq!(out["stdout"], "connected\n", "{out}");
    assert!(l.took_tcp());
    // Still no writes outside, with the network on.
    let out = sh(&t, &format!("echo x > {}", q(&p.outside.join("victim")))).await;
    assert_ne!(out["exit_code"], 0);
    assert_eq!(victim(&p), "original");
}

#[tokio::test]
async fn toolloops_own_environment_is_not_readable_through_proc() {
    let p = place();
    let me = std::process::id();
    let attack = format!("cat /proc/{me}/environ | tr '\\0' '\\n' | grep -c . ");
    let out = sh(&tool(&p, SandboxPolicy::off()), &attack).await;
    assert_ne!(out["stdout"].as_str().unwrap().trim(), "0", "{out}");
    let out = sh(&sandboxed(&p, SandboxMode::WorkspaceWrite), &attack).await;
    assert!(
        out["stdout"].as_str().unwrap().trim() == "0",
        "the sandbox read its parent's environment: {out}"
    );
}

#[tokio::test]
async fn sandboxed_commands_are_allowed_and_leaving_is_for_a_person() {
    let p = place();
    let t = sandboxed(&p, SandboxMode::WorkspaceWrite);
    assert_eq!(t.default_approval(), Action::Allow);
    assert!(!t.approval_required(&json!({"command": ["ls"]})));
    assert!(t.approval_required(&json!({"command": ["ls"], "sandbox": false})));
    // Outside the sandbox the same call is not confined.
    let out = t
        .call(
            json!({
                "command": ["sh", "-c", format!("echo pwned > {}", q(&p.outside.join("victim")))],
                "sandbox": false,
            }),
            ToolContext::detached("c1", "run_command"),
        )
        .await
        .unwrap();
    assert_eq!(out.data.unwrap()["exit_code"], 0);
    assert_eq!(victim(&p), "pwned\n");

    let unsandboxed = tool(&p, SandboxPolicy::off());
    assert_eq!(unsandboxed.default_approval(), Action::Ask);
    assert!(!unsandboxed.approval_required(&json!({"command": ["ls"], "sandbox": false})));
    let mut c = CommandConfig::new(&p.root);
    c.sandbox = policy(&p, SandboxMode::WorkspaceWrite);
    c.sandboxed_approval = Action::Ask;
    assert_eq!(RunCommand::new(c).unwrap().default_approval(), Action::Ask);
}
