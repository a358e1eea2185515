//! The built-in tools as a model is offered them and the loop decides by: each tool's name,
//! description, argument schema, side effect, parallel safety, whether it ends the run and its
//! default approval, pinned byte for byte by `tests/catalog/builtin.json`
//! (`TOOLLOOP_BLESS=1` writes it).

use std::path::Path;
use toolloop::toolbox::Toolbox;
use toolloop_tools::command::{CommandConfig, RunCommand};
use toolloop_tools::fs::builtin_tools;

#[test]
fn the_builtin_tools_catalog_is_the_committed_one() {
    let root = tempfile::tempdir().unwrap();
    let mut toolbox = Toolbox::new();
    for tool in builtin_tools(root.path(), true).unwrap() {
        toolbox.add_arc(tool).unwrap();
    }
    toolbox
        .add(RunCommand::new(CommandConfig::new(root.path())).unwrap())
        .unwrap();
    let fresh = format!(
        "{}\n",
        serde_json::to_string_pretty(toolbox.catalog().entries()).unwrap()
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/catalog/builtin.json");
    if std::env::var_os("TOOLLOOP_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "the built-in tools' catalog differs from {}: a tool's name, description, schema or \
         flags changed; if that is meant, run `TOOLLOOP_BLESS=1 cargo test -p toolloop-tools \
         --test catalog` and commit the file\n--- now:\n{fresh}",
        path.display()
    );
}
