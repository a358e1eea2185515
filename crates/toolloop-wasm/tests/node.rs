//! Runs the npm package's Node tests (`tests/node/*.test.mjs`) against toolloop's mock server:
//! builds the package (`scripts/wasm-build`) and runs `node --test` with the mock's URL.
//! Skipped, saying so, when `node` is not installed.

use std::path::Path;
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_npm_package_passes_its_node_tests_against_the_mock() {
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("skipped: node is not installed");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let build = tokio::task::spawn_blocking({
        let root = root.clone();
        move || Command::new(root.join("scripts/wasm-build")).current_dir(&root).status()
    })
    .await
    .unwrap()
    .expect("scripts/wasm-build runs");
    assert!(build.success(), "scripts/wasm-build failed");
    let server = toolloop_mock::start(toolloop_mock::MockOptions::default())
        .await
        .expect("the mock server starts");
    let url = server.base_url();
    let tests = root.join("crates/toolloop-wasm/tests/node");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg("--test")
            .arg(tests.join("run.test.mjs"))
            .env("TOOLLOOP_MOCK_URL", url)
            .output()
    })
    .await
    .unwrap()
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "node --test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("# fail 0"), "{stdout}");
}
