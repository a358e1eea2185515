//! The npm packages the tests run against, for the test crates that include this file
//! (`#[path = "…/tools/npm/testing.rs"] mod npm;`). Their build script (`build_probe.rs`) sets
//! the `toolloop_npm` cfg when `node` and `npm` are on `PATH`; tests that need the packages carry
//! `#[cfg_attr(not(toolloop_npm), ignore = "…")]` and call [`installed`] first.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

/// Why a test that needs the npm packages is ignored on this machine.
pub(crate) const NO_NPM: &str = "node and npm are not on PATH: the tests against real MCP servers \
                                 and the Restate server need them (tools/npm/package-lock.json)";

/// `tools/npm/node_modules`, installed from the committed lock file by `scripts/npm-install`
/// (quick when it already matches) once per test process. A failed install fails the test: the
/// test was meant to run here.
pub(crate) fn installed() -> PathBuf {
    static DONE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let status = std::process::Command::new("bash")
            .arg(repo.join("scripts/npm-install"))
            .status()
            .map_err(|e| format!("scripts/npm-install did not start: {e}"))?;
        if !status.success() {
            return Err(format!("scripts/npm-install failed ({status})"));
        }
        Ok(repo.join("tools/npm/node_modules"))
    })
    .clone()
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The entry point of an installed MCP server package (`server-everything`, …).
pub(crate) fn mcp_server(name: &str) -> PathBuf {
    let entry = installed()
        .join("@modelcontextprotocol")
        .join(name)
        .join("dist/index.js");
    assert!(
        entry.is_file(),
        "{} is missing after scripts/npm-install",
        entry.display()
    );
    entry.canonicalize().unwrap_or(entry)
}
