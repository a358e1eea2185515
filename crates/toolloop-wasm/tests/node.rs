//! The npm package, tested from outside: builds it (`scripts/wasm-build`, once per test process),
//! then runs its Node tests (`tests/node/*.test.mjs`) against toolloop's mock server, and the demo
//! page in headless Chromium (`tests/browser.mjs`). Both are ignored, with the reason, when `node`
//! and `npm` are not on `PATH`; the browser test also when the build found no Chromium (the
//! `toolloop_chromium` cfg of `tools/npm/build_probe.rs`; puppeteer-core comes from
//! `scripts/npm-install`).

#[path = "../../../tools/npm/testing.rs"]
mod npm;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the package once (after `scripts/npm-install`, so that its types are checked with
/// `tsc`); panics with the script's failure.
fn build() {
    npm::installed();
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let r = BUILT.get_or_init(|| {
        let status = Command::new(root().join("scripts/wasm-build"))
            .current_dir(root())
            .status()
            .map_err(|e| format!("scripts/wasm-build does not run: {e}"))?;
        status
            .success()
            .then_some(())
            .ok_or_else(|| format!("scripts/wasm-build failed ({status})"))
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(toolloop_npm), ignore = "node and npm are not on PATH")]
async fn the_npm_package_passes_its_node_tests_against_the_mock() {
    tokio::task::spawn_blocking(build).await.unwrap();
    let server = toolloop_mock::start(toolloop_mock::MockOptions::default())
        .await
        .expect("the mock server starts");
    let url = server.base_url();
    let tests = root().join("crates/toolloop-wasm/tests/node");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg("--test")
            .arg(tests.join("run.test.mjs"))
            .arg(tests.join("guarantees.test.mjs"))
            .arg(tests.join("conformance.test.mjs"))
            .env("TOOLLOOP_MOCK_URL", url)
            .output()
    })
    .await
    .unwrap()
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "node --test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("# fail 0"), "{stdout}");
    assert!(stdout.contains("# skipped 0"), "{stdout}");
}

#[test]
#[cfg_attr(
    not(all(toolloop_npm, toolloop_chromium)),
    ignore = "needs node and npm (puppeteer-core) and a Chromium on PATH (.ci/chromium installs Debian's)"
)]
fn the_demo_page_runs_a_loop_with_tool_calls_in_chromium() {
    let chromium = Command::new(root().join(".ci/chromium"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    assert!(
        !chromium.is_empty(),
        "the build found a Chromium, .ci/chromium does not: rebuild to skip this test"
    );
    build();
    // The build directory cargo gives integration tests for their files (it exists, wherever
    // CARGO_TARGET_DIR puts it).
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("toolloop-wasm-demo.png");
    let _ = std::fs::remove_file(&shot);
    let out = Command::new("node")
        .arg(root().join("crates/toolloop-wasm/tests/browser.mjs"))
        .arg(&chromium)
        .arg(&shot)
        .output()
        .expect("node runs");
    assert!(
        out.status.success(),
        "the browser test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).expect("the screenshot is saved");
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
}
