//! The Python clients the tests of `toolloop serve` run against, for the test crates that
//! include this file (`#[path = "…/tools/python/testing.rs"] mod python;`). The build script
//! (`tools/npm/build_probe.rs`) sets the `toolloop_python` cfg when `python3` is on `PATH`;
//! tests that need the clients carry `#[cfg_attr(not(toolloop_python), ignore = "…")]` and
//! call [`python`] first.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

/// Why a test that needs the Python clients is ignored on this machine.
pub(crate) const NO_PYTHON: &str = "python3 is not on PATH: the tests against the official \
                                    openai and MCP Python SDKs need it (tools/python/requirements.txt)";

/// The python of a virtual environment under the target directory holding the clients,
/// installed from the committed lock file (hashes checked) by `scripts/python-install` (quick
/// when it already matches) once per test process. A failed install fails the test: the test
/// was meant to run here.
pub(crate) fn python() -> PathBuf {
    static DONE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../python");
        let out = std::process::Command::new("bash")
            .arg(repo.join("scripts/python-install"))
            .arg(&venv)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| format!("scripts/python-install did not start: {e}"))?;
        if !out.status.success() {
            return Err(format!("scripts/python-install failed ({})", out.status));
        }
        let python = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok(PathBuf::from(python))
    })
    .clone()
    .unwrap_or_else(|e| panic!("{e}"))
}
