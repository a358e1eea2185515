//! Build script of the crates whose tests run against npm packages (MCP servers, the Restate
//! server). It only looks: when `node` and `npm` are on `PATH`, it sets the `toolloop_npm` cfg,
//! and those tests install the packages from `tools/npm/package-lock.json` and run; without them
//! the tests are compiled as ignored, with the reason, so they are reported as skipped and never
//! as passed. Likewise `toolloop_python` when `python3` is on `PATH`, for the tests that run
//! the Python clients (installed by `scripts/python-install` from
//! `tools/python/requirements.txt`), and `toolloop_chromium` when a Chromium that `.ci/chromium`
//! would find is on `PATH` (or `TOOLLOOP_CHROMIUM` names one), for the browser tests. No process
//! is started and nothing is downloaded here.

use std::path::Path;

// The command's build script (`crates/toolloop-cli/build.rs`) calls `probe` as a module.
#[allow(dead_code)]
fn main() {
    probe();
}

/// Sets the cfgs above for what is on `PATH`.
pub(crate) fn probe() {
    println!("cargo::rustc-check-cfg=cfg(toolloop_npm)");
    println!("cargo::rustc-check-cfg=cfg(toolloop_python)");
    println!("cargo::rustc-check-cfg=cfg(toolloop_chromium)");
    println!("cargo::rerun-if-env-changed=TOOLLOOP_CHROMIUM");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed=../../tools/npm/build_probe.rs");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = |name: &str| std::env::split_paths(&path).any(|dir| executable(&dir.join(name)));
    if found("node") && found("npm") {
        println!("cargo::rustc-cfg=toolloop_npm");
    }
    if found("python3") {
        println!("cargo::rustc-cfg=toolloop_python");
    }
    // The browser `.ci/chromium` finds (or installs, which CI does before building).
    let browsers = [
        "chromium",
        "chromium-browser",
        "google-chrome-stable",
        "google-chrome",
    ];
    if std::env::var_os("TOOLLOOP_CHROMIUM").is_some_and(|b| !b.is_empty())
        || browsers.iter().any(|b| found(b))
    {
        println!("cargo::rustc-cfg=toolloop_chromium");
    }
}

#[cfg(unix)]
fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn executable(path: &Path) -> bool {
    path.with_extension("exe").is_file() || path.with_extension("cmd").is_file()
}
