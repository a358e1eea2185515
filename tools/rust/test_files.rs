//! A check for the crates whose integration tests are one binary (`autotests = false`, each
//! file of `tests/` a module of `tests/integration.rs`), included by those binaries
//! (`#[path = "…/tools/rust/test_files.rs"] mod test_files;`): a file of `tests/` that is neither
//! a module there nor a test target of its own in the crate's `Cargo.toml` would never be built,
//! nor would its tests run, and nothing else would say so.

use std::path::Path;

/// The files of `dir` (a crate's `tests/`) that `root` (its `integration.rs`) does not declare as
/// modules and `manifest` (its `Cargo.toml`) does not name as a test target's path.
pub(crate) fn left_out(dir: &Path, root: &str, manifest: &str) -> Vec<String> {
    let mut left = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the tests' directory reads") {
        let path = entry.expect("an entry of the tests' directory").path();
        let (Some(stem), Some("rs")) = (
            path.file_stem().and_then(|s| s.to_str()),
            path.extension().and_then(|e| e.to_str()),
        ) else {
            continue;
        };
        let declared = root.lines().any(|l| l.trim() == format!("mod {stem};"));
        let own_target = manifest.contains(&format!("path = \"tests/{stem}.rs\""));
        if !declared && !own_target {
            left.push(format!("tests/{stem}.rs"));
        }
    }
    left.sort();
    left
}

#[test]
fn every_file_of_tests_is_built() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &Path| std::fs::read_to_string(p).expect("the file reads");
    let left = left_out(
        &crate_dir.join("tests"),
        &read(&crate_dir.join("tests/integration.rs")),
        &read(&crate_dir.join("Cargo.toml")),
    );
    assert!(
        left.is_empty(),
        "not built, so never run: {left:?}; declare each as a module in tests/integration.rs \
         (or give it a [[test]] of its own in Cargo.toml)"
    );
}

#[test]
fn a_file_left_out_is_named() {
    let dir = std::env::temp_dir().join(format!("toolloop-test-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "integration.rs",
        "kept.rs",
        "apart.rs",
        "forgotten.rs",
        "notes.txt",
    ] {
        std::fs::write(dir.join(f), "").unwrap();
    }
    let root = "mod kept;\n// mod forgotten;\n";
    let manifest = "[[test]]\nname = \"apart\"\npath = \"tests/apart.rs\"\n\
                    [[test]]\nname = \"integration\"\npath = \"tests/integration.rs\"\n";
    let left = left_out(&dir, root, manifest);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(left, ["tests/forgotten.rs"]);
}
