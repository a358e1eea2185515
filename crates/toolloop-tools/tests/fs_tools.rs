//! The built-in file tools: behaviour, confinement to the root, flags and schemas.

use serde_json::{Value, json};
use std::fs;
use std::path::Path;
use std::sync::Arc;
use tempfile::TempDir;
use toolloop::schema::sample;
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};
use toolloop::toolbox::Toolbox;
use toolloop_tools::fs::{
    ListDir, READ_MAX_BYTES, ReadFile, SearchFiles, WriteFile, builtin_tools,
};

/// A root with a few files, and a directory next to it (outside the root).
struct Fixture {
    _base: TempDir,
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn fixture() -> Fixture {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("root");
    let outside = base.path().join("outside");
    fs::create_dir_all(root.join("src/nested")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(
        root.join("README.md"),
        "# Title\nsome text\n## Usage\nmore\n",
    )
    .unwrap();
    fs::write(
        root.join("src/main.rs"),
        "fn main() {\n    println!(\"hi\");\n}\n",
    )
    .unwrap();
    fs::write(
        root.join("src/nested/lib.rs"),
        "pub fn f() {}\n// TODO: more\n",
    )
    .unwrap();
    fs::write(outside.join("secret.txt"), "top secret\n").unwrap();
    fs::create_dir_all(outside.join("dir")).unwrap();
    fs::write(outside.join("dir/inner.md"), "# outside heading\n").unwrap();
    Fixture {
        _base: base,
        root,
        outside,
    }
}

fn ctx(name: &str) -> ToolContext {
    ToolContext::detached("call-1", name)
}

async fn call(tool: &dyn Tool, args: Value) -> Result<ToolOutput, ToolError> {
    tool.call(args, ctx(tool.name())).await
}

async fn ok(tool: &dyn Tool, args: Value) -> (String, Value) {
    match call(tool, args.clone()).await {
        Ok(out) => (out.message, out.data.unwrap_or(Value::Null)),
        Err(e) => panic!("{} {args} failed: {}", tool.name(), e.message),
    }
}

async fn err(tool: &dyn Tool, args: Value) -> String {
    match call(tool, args.clone()).await {
        Ok(out) => panic!("{} {args} should fail, got {:?}", tool.name(), out),
        Err(e) => e.message,
    }
}

fn all_tools(root: &Path) -> Vec<Arc<dyn Tool>> {
    builtin_tools(root, true).unwrap()
}

/// Arguments that point `tool` at `path` (and give the other required fields).
fn args_for(tool: &str, path: &str) -> Value {
    match tool {
        "write_file" => json!({"path": path, "content": "x"}),
        "search_files" => json!({"path": path, "pattern": "*"}),
        _ => json!({"path": path}),
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

// ------------------------------------------------------------------------------------------
// builtin_tools, flags, schemas
// ------------------------------------------------------------------------------------------

#[test]
fn builtin_tools_offers_write_only_when_allowed() {
    let f = fixture();
    let names = |tools: Vec<Arc<dyn Tool>>| -> Vec<String> {
        tools.iter().map(|t| t.name().to_string()).collect()
    };
    assert_eq!(
        names(builtin_tools(&f.root, false).unwrap()),
        ["read_file", "list_dir", "search_files"]
    );
    assert_eq!(
        names(builtin_tools(&f.root, true).unwrap()),
        ["read_file", "list_dir", "search_files", "write_file"]
    );
}

#[test]
fn builtin_tools_refuses_a_missing_root_or_a_file_root() {
    let f = fixture();
    let missing = builtin_tools(&f.root.join("nope"), false).err().unwrap();
    assert!(missing.to_string().contains("nope"), "{missing}");
    let file = builtin_tools(&f.root.join("README.md"), true)
        .err()
        .unwrap();
    assert!(file.to_string().contains("not a directory"), "{file}");
    assert!(ReadFile::new(f.root.join("nope")).is_err());
    assert!(ListDir::new(f.root.join("README.md")).is_err());
    assert!(SearchFiles::new(f.root.join("nope")).is_err());
    assert!(WriteFile::new(f.root.join("nope")).is_err());
}

#[test]
fn flags_parallel_safety_and_side_effects() {
    let f = fixture();
    for tool in all_tools(&f.root) {
        let (parallel, effect) = match tool.name() {
            "read_file" | "list_dir" | "search_files" => (true, SideEffect::ReadOnly),
            "write_file" => (false, SideEffect::Idempotent),
            other => panic!("unexpected tool {other}"),
        };
        assert_eq!(tool.parallel_safe(), parallel, "{}", tool.name());
        assert_eq!(tool.side_effect(), effect, "{}", tool.name());
        assert!(!tool.terminal(), "{}", tool.name());
        assert!(tool.description().len() > 40, "{}", tool.name());
    }
}

#[test]
fn schemas_sample_to_meaningful_calls_and_pass_the_toolbox() {
    let f = fixture();
    let mut toolbox = Toolbox::new();
    let mut samples = serde_json::Map::new();
    for tool in all_tools(&f.root) {
        let args = sample(tool.parameters());
        toolbox.add_arc(tool.clone()).unwrap();
        toolbox.validate(tool.name(), &args).unwrap();
        samples.insert(tool.name().to_string(), args);
    }
    assert_eq!(samples["read_file"]["path"], json!("README.md"));
    assert_eq!(samples["read_file"]["offset"], json!(0));
    assert_eq!(samples["read_file"]["limit"], json!(2000));
    assert_eq!(samples["list_dir"]["path"], json!("."));
    assert_eq!(samples["search_files"]["pattern"], json!("*.md"));
    assert_eq!(samples["search_files"]["path"], json!("."));
    assert_eq!(samples["search_files"]["max_results"], json!(100));
    assert!(samples["write_file"]["content"].as_str().unwrap().len() > 1);
    let tools = all_tools(&f.root);
    assert_eq!(tools[0].parameters()["required"], json!(["path"]));
}

#[tokio::test]
async fn sampled_calls_succeed_on_a_repository() {
    let f = fixture();
    for tool in all_tools(&f.root) {
        let args = sample(tool.parameters());
        let (message, data) = ok(tool.as_ref(), args).await;
        assert!(!message.is_empty());
        match tool.name() {
            "read_file" => assert!(data["content"].as_str().unwrap().starts_with("# Title")),
            "list_dir" => assert_eq!(data["entries"][0]["name"], json!("README.md")),
            "search_files" => assert_eq!(data["matches"][0]["text"], json!("# Title")),
            _ => assert_eq!(data["created"], json!(true)),
        }
    }
}

#[tokio::test]
async fn bad_arguments_are_errors_not_panics() {
    let f = fixture();
    for tool in all_tools(&f.root) {
        for args in [json!(null), json!([1]), json!({"path": 5}), json!("x")] {
            let message = err(tool.as_ref(), args).await;
            assert!(message.contains(tool.name()), "{message}");
        }
    }
}

// ------------------------------------------------------------------------------------------
// read_file
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn read_file_reads_the_whole_file() {
    let f = fixture();
    let tool = ReadFile::new(&f.root).unwrap();
    let (message, data) = ok(&tool, json!({"path": "src/main.rs"})).await;
    assert_eq!(
        data["content"],
        json!("fn main() {\n    println!(\"hi\");\n}\n")
    );
    assert_eq!(data["first_line"], json!(1));
    assert_eq!(data["last_line"], json!(3));
    assert_eq!(data["next_offset"], Value::Null);
    assert_eq!(data["path"], json!("src/main.rs"));
    assert!(message.contains("lines 1-3"), "{message}");
    assert!(message.contains("end of file"), "{message}");
}

#[tokio::test]
async fn read_file_pages_with_offset_and_limit() {
    let f = fixture();
    let tool = ReadFile::new(&f.root).unwrap();
    let (message, data) = ok(&tool, json!({"path": "README.md", "offset": 1, "limit": 2})).await;
    assert_eq!(data["content"], json!("some text\n## Usage\n"));
    assert_eq!(data["first_line"], json!(2));
    assert_eq!(data["last_line"], json!(3));
    assert_eq!(data["next_offset"], json!(3));
    assert!(message.contains("offset=3"), "{message}");
    let (_, rest) = ok(&tool, json!({"path": "README.md", "offset": 3})).await;
    assert_eq!(rest["content"], json!("more\n"));
    assert_eq!(rest["next_offset"], Value::Null);
    let past = err(&tool, json!({"path": "README.md", "offset": 10})).await;
    assert!(
        past.contains("past the end") && past.contains("4 lines"),
        "{past}"
    );
}

#[tokio::test]
async fn read_file_handles_empty_and_unterminated_files() {
    let f = fixture();
    fs::write(f.root.join("empty.txt"), "").unwrap();
    fs::write(f.root.join("last.txt"), "a\nb").unwrap();
    let tool = ReadFile::new(&f.root).unwrap();
    let (message, data) = ok(&tool, json!({"path": "empty.txt"})).await;
    assert!(message.contains("is empty"), "{message}");
    assert_eq!(data["content"], json!(""));
    let (_, data) = ok(&tool, json!({"path": "last.txt", "offset": 1})).await;
    assert_eq!(data["content"], json!("b"));
    assert_eq!(data["last_line"], json!(2));
}

#[tokio::test]
async fn read_file_refuses_binary_and_non_utf8_files() {
    let f = fixture();
    fs::write(f.root.join("image.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
    fs::write(f.root.join("latin1.txt"), b"caf\xe9\n").unwrap();
    let tool = ReadFile::new(&f.root).unwrap();
    let binary = err(&tool, json!({"path": "image.png"})).await;
    assert!(binary.contains("binary file"), "{binary}");
    assert!(binary.contains("image.png"), "{binary}");
    let latin = err(&tool, json!({"path": "latin1.txt"})).await;
    assert!(
        latin.contains("not UTF-8") && latin.contains("line 1"),
        "{latin}"
    );
}

#[tokio::test]
async fn read_file_stops_at_the_byte_cap_and_continues_with_offset() {
    let f = fixture();
    // 300 KiB of 100-byte lines: more than the default 256 KiB cap.
    let line = format!("{}\n", "x".repeat(99));
    let lines = 3 * 1024;
    fs::write(f.root.join("big.txt"), line.repeat(lines)).unwrap();
    let tool = ReadFile::new(&f.root).unwrap();
    let (message, data) = ok(&tool, json!({"path": "big.txt", "limit": 100000})).await;
    let content = data["content"].as_str().unwrap();
    assert!(content.len() <= READ_MAX_BYTES);
    assert!(content.len() > READ_MAX_BYTES - 100);
    assert_eq!(data["truncated"], json!(true));
    assert!(message.contains("256 KiB"), "{message}");
    let next = data["next_offset"].as_u64().unwrap();
    assert_eq!(next as usize, content.lines().count());
    assert!(message.contains(&format!("offset={next}")), "{message}");
    let (_, rest) = ok(&tool, json!({"path": "big.txt", "offset": next})).await;
    let total = content.len() + rest["content"].as_str().unwrap().len();
    assert_eq!(total, line.len() * lines);
    assert_eq!(rest["next_offset"], Value::Null);
}

#[tokio::test]
async fn read_file_shows_the_head_of_a_line_longer_than_the_cap() {
    let f = fixture();
    // A multi-byte character straddles the cap: the cut must fall on a char boundary.
    fs::write(
        f.root.join("long.txt"),
        format!("{}\nsecond\n", "é".repeat(50)),
    )
    .unwrap();
    let tool = ReadFile::new(&f.root).unwrap().with_max_bytes(11);
    let (message, data) = ok(&tool, json!({"path": "long.txt"})).await;
    assert_eq!(data["content"], json!("ééééé"));
    assert_eq!(data["next_offset"], json!(1));
    assert!(
        message.contains("longer than the 11 bytes cap"),
        "{message}"
    );
    let (_, rest) = ok(&tool, json!({"path": "long.txt", "offset": 1})).await;
    assert_eq!(rest["content"], json!("second\n"));
}

#[tokio::test]
async fn read_file_refuses_directories_and_missing_files() {
    let f = fixture();
    let tool = ReadFile::new(&f.root).unwrap();
    let dir = err(&tool, json!({"path": "src"})).await;
    assert!(
        dir.contains("is a directory") && dir.contains("list_dir"),
        "{dir}"
    );
    let missing = err(&tool, json!({"path": "nope.txt"})).await;
    assert!(missing.contains("`nope.txt` does not exist"), "{missing}");
}

// ------------------------------------------------------------------------------------------
// list_dir
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn list_dir_lists_sorted_entries_with_kind_and_size() {
    let f = fixture();
    fs::write(f.root.join("a.txt"), "12345").unwrap();
    #[cfg(unix)]
    symlink(Path::new("README.md"), &f.root.join("link.md"));
    let tool = ListDir::new(&f.root).unwrap();
    let (message, data) = ok(&tool, json!({})).await;
    let entries = data["entries"].as_array().unwrap();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    let entry = |name: &str| entries.iter().find(|e| e["name"] == json!(name)).unwrap();
    assert_eq!(entry("a.txt")["kind"], json!("file"));
    assert_eq!(entry("a.txt")["size"], json!(5));
    assert_eq!(entry("src")["kind"], json!("dir"));
    #[cfg(unix)]
    assert_eq!(entry("link.md")["kind"], json!("symlink"));
    assert!(message.contains("1 dirs"), "{message}");

    let (_, nested) = ok(&tool, json!({"path": "src/./nested"})).await;
    assert_eq!(nested["path"], json!("src/nested"));
    assert_eq!(
        nested["entries"],
        json!([{"name": "lib.rs", "kind": "file", "size": 28}])
    );
}

#[tokio::test]
async fn list_dir_refuses_files_and_missing_directories() {
    let f = fixture();
    let tool = ListDir::new(&f.root).unwrap();
    let file = err(&tool, json!({"path": "README.md"})).await;
    assert!(
        file.contains("not a directory") && file.contains("read_file"),
        "{file}"
    );
    let missing = err(&tool, json!({"path": "nope"})).await;
    assert!(missing.contains("does not exist"), "{missing}");
}

// ------------------------------------------------------------------------------------------
// search_files
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn search_files_matches_names_and_paths() {
    let f = fixture();
    let tool = SearchFiles::new(&f.root).unwrap();
    let (message, data) = ok(&tool, json!({"pattern": "*.rs"})).await;
    assert_eq!(data["files"], json!(["src/main.rs", "src/nested/lib.rs"]));
    assert!(data.get("matches").is_none());
    assert!(message.starts_with("2 files"), "{message}");
    let (_, data) = ok(&tool, json!({"pattern": "src/*.rs"})).await;
    assert_eq!(data["files"], json!(["src/main.rs"]));
    let (_, data) = ok(&tool, json!({"pattern": "src/**/*.rs"})).await;
    assert_eq!(data["files"], json!(["src/main.rs", "src/nested/lib.rs"]));
    let (_, data) = ok(&tool, json!({"pattern": "*", "path": "src/nested"})).await;
    assert_eq!(data["files"], json!(["src/nested/lib.rs"]));
    let (message, data) = ok(&tool, json!({"pattern": "*.py"})).await;
    assert_eq!(data["files"], json!([]));
    assert!(message.starts_with("0 files"), "{message}");
}

#[tokio::test]
async fn search_files_reports_regex_matches_with_line_numbers() {
    let f = fixture();
    let tool = SearchFiles::new(&f.root).unwrap();
    let (message, data) = ok(&tool, json!({"pattern": "*", "regex": "^#+ "})).await;
    assert_eq!(data["files"], json!(["README.md"]));
    assert_eq!(
        data["matches"],
        json!([
            {"path": "README.md", "line": 1, "text": "# Title"},
            {"path": "README.md", "line": 3, "text": "## Usage"},
        ])
    );
    assert!(message.contains("2 matching lines"), "{message}");
    let (_, data) = ok(&tool, json!({"pattern": "*.rs", "regex": "TODO"})).await;
    assert_eq!(
        data["matches"],
        json!([{"path": "src/nested/lib.rs", "line": 2, "text": "// TODO: more"}])
    );
}

#[tokio::test]
async fn search_files_caps_results() {
    let f = fixture();
    let body: String = (0..50).map(|i| format!("hit {i}\n")).collect();
    fs::write(f.root.join("many.txt"), body).unwrap();
    let tool = SearchFiles::new(&f.root).unwrap();
    let (message, data) = ok(
        &tool,
        json!({"regex": "hit", "pattern": "*.txt", "max_results": 5}),
    )
    .await;
    let matches = data["matches"].as_array().unwrap();
    assert_eq!(matches.len(), 5);
    assert_eq!(matches[4]["line"], json!(5));
    assert_eq!(data["truncated"], json!(true));
    assert!(message.contains("max_results=5"), "{message}");
    let (_, data) = ok(&tool, json!({"pattern": "*", "max_results": 2})).await;
    assert_eq!(data["files"].as_array().unwrap().len(), 2);
    assert_eq!(data["truncated"], json!(true));
}

#[tokio::test]
async fn search_files_shortens_long_lines_on_char_boundaries() {
    let f = fixture();
    fs::write(
        f.root.join("wide.txt"),
        format!("needle {}\r\n", "ü".repeat(1000)),
    )
    .unwrap();
    let tool = SearchFiles::new(&f.root).unwrap();
    let (_, data) = ok(&tool, json!({"pattern": "wide.txt", "regex": "needle"})).await;
    let text = data["matches"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("needle ü"));
    assert!(text.ends_with('…'));
    assert!(text.chars().count() <= 301, "{}", text.chars().count());
}

#[tokio::test]
async fn search_files_respects_gitignore_and_skips_git() {
    let f = fixture();
    fs::write(f.root.join(".gitignore"), "target/\n*.log\n").unwrap();
    fs::create_dir_all(f.root.join("target")).unwrap();
    fs::write(f.root.join("target/out.md"), "# built\n").unwrap();
    fs::write(f.root.join("debug.log"), "# log\n").unwrap();
    fs::create_dir_all(f.root.join(".git")).unwrap();
    fs::write(f.root.join(".git/notes.md"), "# git\n").unwrap();
    fs::create_dir_all(f.root.join(".github")).unwrap();
    fs::write(f.root.join(".github/ci.md"), "# ci\n").unwrap();
    let tool = SearchFiles::new(&f.root).unwrap();
    let (_, data) = ok(&tool, json!({"pattern": "*", "regex": "^# "})).await;
    assert_eq!(data["files"], json!([".github/ci.md", "README.md"]));
    let (_, data) = ok(&tool, json!({"pattern": "*"})).await;
    let files: Vec<&str> = data["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(files.contains(&".gitignore"));
    assert!(
        !files
            .iter()
            .any(|p| p.starts_with(".git/") || p.starts_with("target"))
    );
    assert!(!files.contains(&"debug.log"));
}

#[tokio::test]
async fn search_files_respects_gitignore_outside_a_git_repository() {
    let f = fixture();
    fs::write(f.root.join(".gitignore"), "*.rs\n").unwrap();
    let tool = SearchFiles::new(&f.root).unwrap();
    let (_, data) = ok(&tool, json!({"pattern": "*.rs"})).await;
    assert_eq!(data["files"], json!([]));
}

#[tokio::test]
async fn search_files_skips_binary_files_in_content_search() {
    let f = fixture();
    fs::write(f.root.join("blob.bin"), b"needle\0\0\0").unwrap();
    fs::write(f.root.join("text.txt"), "needle\n").unwrap();
    let tool = SearchFiles::new(&f.root).unwrap();
    let (message, data) = ok(&tool, json!({"pattern": "*", "regex": "needle"})).await;
    assert_eq!(data["files"], json!(["text.txt"]));
    assert!(message.contains("1 files skipped"), "{message}");
}

#[tokio::test]
async fn search_files_refuses_bad_globs_and_regexes() {
    let f = fixture();
    let tool = SearchFiles::new(&f.root).unwrap();
    let glob = err(&tool, json!({"pattern": "a[b"})).await;
    assert!(glob.contains("`a[b` is not a valid glob"), "{glob}");
    let regex = err(&tool, json!({"regex": "(unclosed"})).await;
    assert!(
        regex.contains("`(unclosed` is not a valid regular expression"),
        "{regex}"
    );
}

#[tokio::test]
async fn search_files_stops_when_cancelled() {
    let f = fixture();
    let tool = SearchFiles::new(&f.root).unwrap();
    let context = ctx("search_files");
    context.cancel.cancel();
    let e = tool
        .call(json!({"pattern": "*"}), context)
        .await
        .unwrap_err();
    assert!(e.message.contains("cancelled"), "{}", e.message);
}

// ------------------------------------------------------------------------------------------
// write_file
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn write_file_creates_parents_replaces_and_is_idempotent() {
    let f = fixture();
    let tool = WriteFile::new(&f.root).unwrap();
    let args = json!({"path": "new/deep/file.txt", "content": "hello\n"});
    let (message, data) = ok(&tool, args.clone()).await;
    assert_eq!(
        fs::read_to_string(f.root.join("new/deep/file.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        data,
        json!({"path": "new/deep/file.txt", "bytes": 6, "created": true, "changed": true})
    );
    assert!(message.starts_with("created"), "{message}");
    let (message, data) = ok(&tool, args).await;
    assert_eq!(data["changed"], json!(false));
    assert!(message.contains("already has this content"), "{message}");
    let (message, data) = ok(&tool, json!({"path": "README.md", "content": "new"})).await;
    assert_eq!(fs::read_to_string(f.root.join("README.md")).unwrap(), "new");
    assert_eq!(data["created"], json!(false));
    assert!(message.starts_with("replaced"), "{message}");
}

#[tokio::test]
async fn write_file_refuses_directories_and_files_used_as_directories() {
    let f = fixture();
    let tool = WriteFile::new(&f.root).unwrap();
    let dir = err(&tool, json!({"path": "src", "content": "x"})).await;
    assert!(dir.contains("is a directory"), "{dir}");
    let root = err(&tool, json!({"path": ".", "content": "x"})).await;
    assert!(root.contains("is a directory"), "{root}");
    let under_file = err(&tool, json!({"path": "README.md/x.txt", "content": "x"})).await;
    assert!(under_file.contains("README.md/x.txt"), "{under_file}");
}

// ------------------------------------------------------------------------------------------
// Confinement, for every tool
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn every_tool_refuses_absolute_paths() {
    let f = fixture();
    let inside = f.root.join("README.md");
    let outside = f.outside.join("secret.txt");
    for tool in all_tools(&f.root) {
        let name = tool.name();
        let e = err(tool.as_ref(), args_for(name, outside.to_str().unwrap())).await;
        assert!(e.contains("is outside the root"), "{name}: {e}");
        assert!(e.contains("absolute paths are not allowed"), "{name}: {e}");
        let e = err(tool.as_ref(), args_for(name, inside.to_str().unwrap())).await;
        assert!(e.contains("absolute paths are not allowed"), "{name}: {e}");
        assert!(e.contains("`README.md`"), "{name}: {e}");
    }
    assert_eq!(fs::read_to_string(&outside).unwrap(), "top secret\n");
}

#[tokio::test]
async fn every_tool_refuses_parent_components() {
    let f = fixture();
    for tool in all_tools(&f.root) {
        let name = tool.name();
        for path in ["../outside/secret.txt", "src/../../outside/x", "src/.."] {
            let e = err(tool.as_ref(), args_for(name, path)).await;
            assert!(
                e.contains(&format!("path `{path}` is outside the root")),
                "{name}: {e}"
            );
            assert!(e.contains("`..` is not allowed"), "{name}: {e}");
        }
    }
    assert!(!f.outside.join("x").exists());
}

#[cfg(unix)]
#[tokio::test]
async fn every_tool_refuses_symlinks_that_escape() {
    let f = fixture();
    symlink(&f.outside.join("secret.txt"), &f.root.join("file_link"));
    symlink(&f.outside.join("dir"), &f.root.join("dir_link"));
    symlink(&f.outside.join("missing"), &f.root.join("dangling"));
    for tool in all_tools(&f.root) {
        let name = tool.name();
        for path in [
            "file_link",
            "dir_link",
            "dir_link/inner.md",
            "dir_link/new/deep.txt",
        ] {
            let e = err(tool.as_ref(), args_for(name, path)).await;
            assert!(
                e.contains(&format!("path `{path}` is outside the root")),
                "{name} {path}: {e}"
            );
            assert!(e.contains("symbolic link"), "{name} {path}: {e}");
        }
        for path in ["dangling", "dangling/x.txt"] {
            let e = err(tool.as_ref(), args_for(name, path)).await;
            assert!(e.contains("symbolic link"), "{name} {path}: {e}");
        }
    }
    assert_eq!(
        fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        "top secret\n"
    );
    assert!(!f.outside.join("dir/new").exists());
    assert!(!f.outside.join("missing").exists());
}

#[cfg(unix)]
#[tokio::test]
async fn search_files_does_not_follow_links_out_of_the_root() {
    let f = fixture();
    symlink(
        &f.outside.join("secret.txt"),
        &f.root.join("secret_link.txt"),
    );
    symlink(&f.outside.join("dir"), &f.root.join("dir_link"));
    symlink(&f.root.join("README.md"), &f.root.join("inside_link.md"));
    let tool = SearchFiles::new(&f.root).unwrap();
    let (_, data) = ok(
        &tool,
        json!({"pattern": "*", "regex": "secret|heading|Title"}),
    )
    .await;
    assert_eq!(data["files"], json!(["README.md", "inside_link.md"]));
    let (_, data) = ok(&tool, json!({"pattern": "*"})).await;
    let files = data["files"].to_string();
    assert!(
        !files.contains("secret") && !files.contains("inner"),
        "{files}"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn symlinks_that_stay_inside_the_root_work() {
    let f = fixture();
    symlink(Path::new("src/main.rs"), &f.root.join("main_link.rs"));
    symlink(Path::new("src/nested"), &f.root.join("nested_link"));
    let tools = all_tools(&f.root);
    let tool = |name: &str| tools.iter().find(|t| t.name() == name).unwrap().clone();

    let (_, data) = ok(tool("read_file").as_ref(), json!({"path": "main_link.rs"})).await;
    assert!(data["content"].as_str().unwrap().starts_with("fn main"));
    assert_eq!(data["path"], json!("src/main.rs"));
    let (_, data) = ok(
        tool("read_file").as_ref(),
        json!({"path": "nested_link/lib.rs"}),
    )
    .await;
    assert!(data["content"].as_str().unwrap().starts_with("pub fn f"));
    let (_, data) = ok(tool("list_dir").as_ref(), json!({"path": "nested_link"})).await;
    assert_eq!(data["entries"][0]["name"], json!("lib.rs"));
    let (_, data) = ok(
        tool("search_files").as_ref(),
        json!({"path": "nested_link", "pattern": "*.rs", "regex": "TODO"}),
    )
    .await;
    assert_eq!(data["matches"][0]["line"], json!(2));
    ok(
        tool("write_file").as_ref(),
        json!({"path": "nested_link/new/made.txt", "content": "made"}),
    )
    .await;
    assert_eq!(
        fs::read_to_string(f.root.join("src/nested/new/made.txt")).unwrap(),
        "made"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn a_root_reached_through_a_symlink_is_canonicalized() {
    let f = fixture();
    let alias = f.outside.join("root_alias");
    symlink(&f.root, &alias);
    let tool = ReadFile::new(&alias).unwrap();
    let (_, data) = ok(&tool, json!({"path": "README.md"})).await;
    assert!(data["content"].as_str().unwrap().starts_with("# Title"));
    let e = err(&tool, json!({"path": "../secret.txt"})).await;
    assert!(e.contains("`..` is not allowed"), "{e}");
}

// ------------------------------------------------------------------------------------------
// Races, special files, atomic writes, cancellation
// ------------------------------------------------------------------------------------------

/// Runs `test` on its own runtime and does not wait for blocking work it left behind, so a
/// tool stuck in a system call fails the test instead of hanging it.
#[cfg(unix)]
fn on_runtime<F: std::future::Future<Output = ()>>(test: F) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(test)));
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Like [`call`], but fails the test when the call takes longer than 5 seconds.
#[cfg(unix)]
async fn call_quickly(tool: &dyn Tool, args: Value) -> Result<ToolOutput, ToolError> {
    let limit = std::time::Duration::from_secs(5);
    match tokio::time::timeout(limit, call(tool, args.clone())).await {
        Ok(result) => result,
        Err(_) => panic!("{} {args} did not return within {limit:?}", tool.name()),
    }
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        path,
        rustix::fs::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
}

#[cfg(unix)]
#[test]
fn every_tool_refuses_fifos_and_sockets_without_blocking() {
    let f = fixture();
    mkfifo(&f.root.join("pipe"));
    let _socket = std::os::unix::net::UnixListener::bind(f.root.join("sock")).unwrap();
    on_runtime(async {
        let tools = all_tools(&f.root);
        let tool = |name: &str| tools.iter().find(|t| t.name() == name).unwrap().clone();
        for (path, kind) in [("pipe", "FIFO"), ("sock", "socket")] {
            for name in ["write_file", "read_file"] {
                let e = call_quickly(tool(name).as_ref(), args_for(name, path))
                    .await
                    .unwrap_err()
                    .message;
                assert!(
                    e.contains(&format!("`{path}` is a {kind}"))
                        && e.contains("not a regular file"),
                    "{name} {path}: {e}"
                );
            }
            let e = call_quickly(tool("list_dir").as_ref(), json!({"path": path}))
                .await
                .unwrap_err()
                .message;
            assert!(e.contains("not a directory") && e.contains(kind), "{e}");
        }
        let (_, data) = ok(
            tool("search_files").as_ref(),
            json!({"pattern": "*", "regex": "x"}),
        )
        .await;
        let files = data["files"].to_string();
        assert!(
            !files.contains("pipe") && !files.contains("sock"),
            "{files}"
        );
    });
    assert!(
        std::fs::symlink_metadata(f.root.join("pipe"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

#[cfg(unix)]
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

#[cfg(unix)]
#[tokio::test]
async fn write_file_replaces_atomically_and_keeps_permissions() {
    use std::io::Read;
    let f = fixture();
    let path = f.root.join("src/main.rs");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
    let before = fs::metadata(&path).unwrap();
    // A reader that opened the file before the write goes on reading the old content whole.
    let mut reader = fs::File::open(&path).unwrap();
    let tool = WriteFile::new(&f.root).unwrap();
    let (message, _) = ok(&tool, json!({"path": "src/main.rs", "content": "new\n"})).await;
    assert!(message.starts_with("replaced"), "{message}");
    let mut old = String::new();
    reader.read_to_string(&mut old).unwrap();
    assert_eq!(old, "fn main() {\n    println!(\"hi\");\n}\n");
    let after = fs::metadata(&path).unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), "new\n");
    assert_ne!(after.ino(), before.ino(), "the file was rewritten in place");
    assert_eq!(after.permissions().mode() & 0o7777, 0o640);
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    // No temporary file is left next to it, after a creation either.
    ok(&tool, json!({"path": "src/made.rs", "content": "made\n"})).await;
    let mut names: Vec<String> = fs::read_dir(f.root.join("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["made.rs", "main.rs", "nested"]);
}

#[cfg(unix)]
#[tokio::test]
async fn write_file_does_not_write_through_a_hard_link_to_outside() {
    let f = fixture();
    fs::hard_link(f.outside.join("secret.txt"), f.root.join("linked.txt")).unwrap();
    let tool = WriteFile::new(&f.root).unwrap();
    ok(
        &tool,
        json!({"path": "linked.txt", "content": "overwritten\n"}),
    )
    .await;
    assert_eq!(
        fs::read_to_string(f.root.join("linked.txt")).unwrap(),
        "overwritten\n"
    );
    assert_eq!(
        fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        "top secret\n"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn write_file_through_an_inside_link_replaces_the_target_and_keeps_the_link() {
    let f = fixture();
    symlink(Path::new("src/main.rs"), &f.root.join("main_link.rs"));
    let tool = WriteFile::new(&f.root).unwrap();
    let (_, data) = ok(
        &tool,
        json!({"path": "main_link.rs", "content": "linked\n"}),
    )
    .await;
    assert_eq!(data["path"], json!("src/main.rs"));
    assert!(
        fs::symlink_metadata(f.root.join("main_link.rs"))
            .unwrap()
            .is_symlink()
    );
    assert_eq!(
        fs::read_to_string(f.root.join("src/main.rs")).unwrap(),
        "linked\n"
    );
}

/// Replacing a large file does not read it: the old file is not even opened (watched with
/// inotify), since the new content goes to a new file renamed over it.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn write_file_does_not_read_the_file_it_replaces() {
    use rustix::fs::inotify;
    let f = fixture();
    let big = f.root.join("big.log");
    // 4 GiB, sparse: nothing is stored, but reading it whole would take 4 GiB of memory.
    fs::File::create(&big).unwrap().set_len(4 << 30).unwrap();
    let watch =
        inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC).unwrap();
    inotify::add_watch(
        &watch,
        &big,
        inotify::WatchFlags::OPEN | inotify::WatchFlags::ACCESS,
    )
    .unwrap();
    let tool = WriteFile::new(&f.root).unwrap();
    let (message, _) = ok(&tool, json!({"path": "big.log", "content": "small\n"})).await;
    assert!(message.starts_with("replaced"), "{message}");
    assert_eq!(fs::read_to_string(&big).unwrap(), "small\n");
    let mut buf = [std::mem::MaybeUninit::uninit(); 1024];
    let mut events = inotify::Reader::new(&watch, &mut buf);
    let mut opened = Vec::new();
    loop {
        match events.next() {
            // (The watch ends with IGNORED once the replaced file is gone.)
            Ok(event)
                if event
                    .events()
                    .intersects(inotify::ReadFlags::OPEN | inotify::ReadFlags::ACCESS) =>
            {
                opened.push(format!("{:?}", event.events()))
            }
            Ok(_) => {}
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => panic!("inotify: {e}"),
        }
    }
    assert!(opened.is_empty(), "the old file was opened: {opened:?}");
}

/// A read that would take minutes stops when the run is cancelled: the call returns at once
/// and the file is closed soon after.
#[cfg(target_os = "linux")]
#[test]
fn read_file_stops_when_cancelled() {
    let f = fixture();
    let huge = f.root.join("huge.txt");
    // 1 TiB without a line break (text first, then sparse): skipping to line 2 reads all of it.
    let mut file = fs::File::create(&huge).unwrap();
    std::io::Write::write_all(&mut file, &[b'x'; 64 * 1024]).unwrap();
    file.set_len(1 << 40).unwrap();
    drop(file);
    let open_handles = || {
        fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| fs::read_link(e.unwrap().path()).ok())
            .filter(|target| target == &huge)
            .count()
    };
    on_runtime(async {
        let tool = ReadFile::new(&f.root).unwrap();
        let context = ctx("read_file");
        let cancel = context.cancel.clone();
        let started = std::time::Instant::now();
        let call = tool.call(json!({"path": "huge.txt", "offset": 1}), context);
        let canceller = async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            cancel.cancel();
        };
        let (result, ()) = tokio::join!(
            tokio::time::timeout(std::time::Duration::from_secs(5), call),
            canceller
        );
        let e = result
            .expect("the call returns when cancelled")
            .unwrap_err();
        assert!(e.message.contains("cancelled"), "{}", e.message);
        assert!(started.elapsed() < std::time::Duration::from_secs(3));
    });
    let started = std::time::Instant::now();
    while open_handles() > 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "the read went on after the cancellation"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// One thread swaps a directory inside the root for a link to outside and back, and plants
/// links to outside at the names of files about to be written, while hundreds of calls run.
/// Nothing from outside is ever returned, and nothing is written outside.
#[cfg(unix)]
#[test]
fn racing_swaps_never_lead_outside_the_root() {
    use futures::StreamExt;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let f = fixture();
    let flip = f.root.join("flip");
    let stash = f.root.join("stash");
    let link = f.root.join("stash_link");
    fs::create_dir_all(&flip).unwrap();
    fs::write(flip.join("data.txt"), "inside data\n").unwrap();
    let away = f.outside.join("away");
    fs::create_dir_all(&away).unwrap();
    fs::write(away.join("data.txt"), "OUTSIDE data\n").unwrap();
    fs::write(away.join("only_outside.txt"), "OUTSIDE only\n").unwrap();
    symlink(&away, &link);
    let snapshot = |dir: &Path| {
        let mut files: Vec<(String, String)> = ignore::WalkBuilder::new(dir)
            .standard_filters(false)
            .build()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_some_and(|t| !t.is_dir()))
            .map(|e| {
                let content = fs::read_to_string(e.path()).unwrap_or_default();
                (e.path().display().to_string(), content)
            })
            .collect();
        files.sort();
        files
    };
    let outside_before = snapshot(&f.outside);

    // At least this many calls, for at least this long.
    const CALLS: usize = 600;
    const RACE: std::time::Duration = std::time::Duration::from_millis(2000);
    let stop = AtomicBool::new(false);
    let (swaps, issued) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let (ok_reads, ok_writes) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let leaks = std::sync::Mutex::new(Vec::<String>::new());
    std::thread::scope(|scope| {
        // The swapping stops even when a check fails.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                // `flip` becomes a link to outside, then a directory again.
                let _ = fs::rename(&flip, &stash);
                let _ = fs::rename(&link, &flip);
                let _ = fs::rename(&flip, &link);
                let _ = fs::rename(&stash, &flip);
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        });
        scope.spawn(|| {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                // Links to outside at the names of the files about to be created.
                let next = issued.load(Ordering::Relaxed);
                let planted: Vec<_> = (next..next + 12)
                    .map(|i| f.root.join(format!("new_{i}.txt")))
                    .collect();
                for path in &planted {
                    n += 1;
                    let _ =
                        std::os::unix::fs::symlink(f.outside.join(format!("planted_{n}")), path);
                }
                for path in &planted {
                    if fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink()) {
                        let _ = fs::remove_file(path);
                    }
                }
            }
        });
        on_runtime(async {
            let tools = all_tools(&f.root);
            let tool = |name: &str| tools.iter().find(|t| t.name() == name).unwrap().clone();
            let started = std::time::Instant::now();
            let go_on = |i: &usize| {
                let more = *i < CALLS || started.elapsed() < RACE;
                std::future::ready(more)
            };
            let calls = futures::stream::iter(0..).take_while(go_on).map(|i| {
                issued.store(i, Ordering::Relaxed);
                let (name, args) = match i % 6 {
                    0 | 1 => ("read_file", json!({"path": "flip/data.txt"})),
                    2 => ("list_dir", json!({"path": "flip"})),
                    3 => (
                        "search_files",
                        json!({"path": "flip", "pattern": "*", "regex": "data|only"}),
                    ),
                    4 => (
                        "write_file",
                        json!({"path": format!("flip/w_{i}.txt"), "content": "w"}),
                    ),
                    _ => (
                        "write_file",
                        json!({"path": format!("new_{i}.txt"), "content": "n"}),
                    ),
                };
                let tool = tool(name);
                let (ok_reads, ok_writes, leaks) = (&ok_reads, &ok_writes, &leaks);
                async move {
                    if let Ok(out) = call(tool.as_ref(), args.clone()).await {
                        let shown = format!("{} {}", out.message, out.data.unwrap_or_default());
                        if shown.contains("OUTSIDE") || shown.contains("only_outside") {
                            leaks
                                .lock()
                                .unwrap()
                                .push(format!("{name} {args}: {shown}"));
                        }
                        match name {
                            "write_file" => ok_writes.fetch_add(1, Ordering::Relaxed),
                            _ => ok_reads.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }
            });
            calls.buffer_unordered(8).collect::<Vec<()>>().await;
        });
    });
    let leaks = leaks.into_inner().unwrap();
    assert!(
        leaks.is_empty(),
        "{} calls returned something from outside, the first: {}",
        leaks.len(),
        leaks[0]
    );
    assert_eq!(
        snapshot(&f.outside),
        outside_before,
        "something was written outside"
    );
    // The run did exercise both sides: calls succeeded while the swaps went on.
    assert!(swaps.load(Ordering::Relaxed) > 10);
    assert!(ok_reads.load(Ordering::Relaxed) > 0 && ok_writes.load(Ordering::Relaxed) > 0);
}
