//! What approval rules see of the built-in tools' calls: the path a file tool will touch (links
//! resolved, `.`, `//` and trailing `/` worked out) and the program `run_command` will run (by
//! any spelling, through launchers), so that `deny` and `ask` rules win over every spelling.
#![cfg(unix)]

use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use toolloop::approval::{Action, Approvals, Rule, Verdict};
use toolloop::tool::{Tool, ToolContext};
use toolloop_tools::command::{CommandConfig, RunCommand};
use toolloop_tools::fs::{ReadFile, SearchFiles, WriteFile};

fn policy(rules: &[(Action, &str)]) -> Approvals {
    rules
        .iter()
        .fold(Approvals::default(), |p, (action, spec)| {
            p.rule(Rule::parse(*action, spec).unwrap())
        })
}

fn verdict(policy: &Approvals, tool: &dyn Tool, args: Value) -> Verdict {
    let subject = tool.approval_subject(&args);
    policy.verdict_for(tool.name(), &subject, tool.default_approval())
}

fn denied(v: &Verdict) -> bool {
    matches!(v, Verdict::Deny { .. })
}

/// A project: `src/main.rs`, `Cargo.lock`, `secret.env`, links `lk → Cargo.lock`,
/// `sl → secret.env`, `code → src`, and `out → ../outside.env` (leaving the root).
fn project() -> (tempfile::TempDir, std::path::PathBuf) {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("root");
    fs::create_dir_all(root.join("src")).unwrap();
    fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(root.join("Cargo.lock"), "# lock\n").unwrap();
    fs::write(root.join("secret.env"), "KEY=1\n").unwrap();
    fs::write(base.path().join("outside.env"), "KEY=2\n").unwrap();
    symlink("Cargo.lock", root.join("lk")).unwrap();
    symlink("secret.env", root.join("sl")).unwrap();
    symlink("src", root.join("code")).unwrap();
    symlink("../outside.env", root.join("out")).unwrap();
    (base, root)
}

#[test]
fn file_rules_match_the_resolved_path_of_every_spelling() {
    let (_base, root) = project();
    let write = WriteFile::new(&root).unwrap();
    let read = ReadFile::new(&root).unwrap();
    let p = policy(&[
        (Action::Allow, "write_file"),
        (Action::Ask, "write_file:src/*"),
        (Action::Deny, "write_file:*.lock"),
        (Action::Deny, "read_file:*.env"),
    ]);
    let w = |path: &str| verdict(&p, &write, json!({"path": path, "content": "x"}));
    let r = |path: &str| verdict(&p, &read, json!({ "path": path }));

    // The subject is the path the call touches.
    let s = write.approval_subject(&json!({"path": "./src//main.rs/", "content": "x"}));
    assert_eq!(s.text, "src/main.rs");
    assert!(s.uncertain.is_none());
    assert_eq!(
        write
            .approval_subject(&json!({"path": "code/new.rs", "content": "x"}))
            .text,
        "src/new.rs",
        "a link to a directory is followed, a missing file named"
    );
    assert_eq!(
        write
            .approval_subject(&json!({"path": "new/dir/f.txt", "content": "x"}))
            .text,
        "new/dir/f.txt",
        "directories still to create are named"
    );

    for path in [
        "./src/main.rs",
        "src//main.rs",
        "code/main.rs",
        "./code/new.rs",
    ] {
        assert_eq!(w(path), Verdict::Ask, "{path}");
    }
    for path in ["Cargo.lock/", "./Cargo.lock", "lk", "./lk/", "CARGO.LOCK"] {
        assert!(denied(&w(path)), "{path}: {:?}", w(path));
    }
    for path in ["sl", "./sl", "secret.env", "out"] {
        assert!(denied(&r(path)), "{path}: {:?}", r(path));
    }
    assert!(matches!(w("notes.txt"), Verdict::Allow { .. }));
    assert!(matches!(r("src/main.rs"), Verdict::Allow { .. }));

    // Outside the root, absolute, `..`: uncertain, so the deny rules of the tool apply.
    for path in ["out", "../outside.env", "/etc/passwd", "src/../Cargo.lock"] {
        let s = read.approval_subject(&json!({ "path": path }));
        assert!(s.uncertain.is_some(), "{path}: {s:?}");
        match r(path) {
            // The rule's glob does not match the words: the denial says why it applies.
            Verdict::Deny { rule } if !path.ends_with(".env") => {
                assert!(rule.contains("does not resolve beneath the root"), "{rule}")
            }
            Verdict::Deny { rule } => assert_eq!(rule, "deny read_file:*.env"),
            other => panic!("{path}: {other:?}"),
        }
    }
}

#[test]
fn allow_rules_are_not_widened_by_resolution() {
    let (_base, root) = project();
    let write = WriteFile::new(&root).unwrap();
    let p = policy(&[(Action::Allow, "write_file:src/*")]);
    let w = |path: &str| verdict(&p, &write, json!({"path": path, "content": "x"}));
    assert!(matches!(
        w("./src/main.rs"),
        Verdict::Allow { rule: Some(_) }
    ));
    assert!(matches!(
        w("code/main.rs"),
        Verdict::Allow { rule: Some(_) }
    ));
    // A link under src/ to a file elsewhere is what it touches: not under src/.
    symlink("../Cargo.lock", root.join("src/lock")).unwrap();
    assert!(matches!(w("src/lock"), Verdict::Allow { rule: None }));
}

fn argv(items: &[&str]) -> Value {
    json!({ "command": items })
}

#[tokio::test]
async fn command_rules_match_the_program_by_every_spelling() {
    let (_base, root) = project();
    fs::write(root.join("b"), "x").unwrap();
    let rm = which("rm");
    symlink(&rm, root.join("del")).unwrap();
    let mut config = CommandConfig::new(&root);
    config.allow_shell = true;
    let tool = RunCommand::new(config).unwrap();
    let p = policy(&[
        (Action::Allow, "run_command"),
        (Action::Deny, "run_command:rm *"),
    ]);
    let rm_path = rm.to_string_lossy().into_owned();
    let doubled = format!("/{}", rm_path.replace('/', "//"));
    let dotted = format!("{}/./../{}/rm", parent(&rm), dir_name(&rm));
    for spelling in [
        vec!["rm", "b"],
        vec![&rm_path, "b"],
        vec![&doubled, "b"],
        vec![&dotted, "b"],
        vec!["./del", "b"],
        vec!["RM", "b"],
        vec!["env", "rm", "b"],
        vec!["env", "-i", "X=1", &rm_path, "b"],
        vec!["busybox", "rm", "b"],
        vec!["nice", "-n", "5", "timeout", "9", "rm", "b"],
        vec!["xargs", "rm", "b"],
    ] {
        let v = verdict(&p, &tool, argv(&spelling));
        assert!(denied(&v), "{spelling:?}: {v:?}");
    }
    // A shell runs what its script says: in doubt, denied, saying why.
    match verdict(&p, &tool, argv(&["sh", "-c", "r\"m\" b"])) {
        Verdict::Deny { rule } => assert!(rule.contains("shell"), "{rule}"),
        other => panic!("{other:?}"),
    }
    match verdict(&p, &tool, argv(&["/bin/BASH", "script"])) {
        Verdict::Deny { .. } => {}
        other => panic!("{other:?}"),
    }
    // Other programs, and rm's name as an argument of a program that is no launcher, run.
    for ok in [
        vec!["ls", "b"],
        vec!["echo", "rm", "b"],
        vec!["git", "rm", "b"],
    ] {
        assert!(
            matches!(verdict(&p, &tool, argv(&ok)), Verdict::Allow { .. }),
            "{ok:?}"
        );
    }
    // The denied spellings really are rm: `./del b` would have removed b.
    let out = tool
        .call(
            argv(&["./del", "b"]),
            ToolContext::detached("c", "run_command"),
        )
        .await
        .unwrap();
    assert_eq!(out.data.unwrap()["exit_code"], 0);
    assert!(!root.join("b").exists());
}

#[test]
fn command_allow_rules_match_the_command_as_given_only() {
    let (_base, root) = project();
    let tool = RunCommand::new(CommandConfig::new(&root)).unwrap();
    let p = policy(&[(Action::Allow, "run_command:cargo test*")]);
    let v = |items: &[&str]| verdict(&p, &tool, argv(items));
    assert!(matches!(
        v(&["cargo", "test"]),
        Verdict::Allow { rule: Some(_) }
    ));
    // A `cargo` of the model's own in the root is not the cargo the rule allows.
    assert_eq!(v(&["./cargo", "test"]), Verdict::Ask);
    assert_eq!(v(&["env", "cargo", "test"]), Verdict::Ask);
}

#[tokio::test]
async fn search_files_refuses_a_glob_of_100000_stars() {
    let (_base, root) = project();
    let tool = SearchFiles::new(&root).unwrap();
    let e = tool
        .call(
            json!({ "pattern": "*".repeat(100_000) }),
            ToolContext::detached("c", "search_files"),
        )
        .await
        .unwrap_err();
    assert!(e.message.contains("is not a valid glob"), "{}", e.message);
    assert!(e.message.contains("at most 4096"), "{}", e.message);
    assert!(e.message.len() < 1000, "the pattern is not echoed whole");
}

fn which(program: &str) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is on PATH"))
}

fn parent(p: &Path) -> String {
    p.parent().unwrap().to_string_lossy().into_owned()
}

fn dir_name(p: &Path) -> String {
    p.parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}
