//! Helpers shared by the command's integration tests.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every run is logged to the store: keep the tests' runs out of the user's data directory.
pub(crate) fn test_store() -> String {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    dir.path().join("store.db").to_string_lossy().into_owned()
}

/// The binary, in `dir`, with a throwaway store and none of the user's model settings.
pub(crate) fn command(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toolloop"));
    c.args(args)
        .current_dir(dir)
        .env("TOOLLOOP_STORE", test_store())
        .env("TOOLLOOP_CONFIG", "")
        .env_remove("TOOLLOOP_MODEL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("GEMINI_API_KEY")
        .env_remove("GOOGLE_API_KEY");
    c
}

/// Runs the binary to the end.
pub(crate) fn toolloop(args: &[&str], dir: &Path) -> Output {
    command(args, dir).output().expect("the binary runs")
}

/// Stdout as JSON, or a panic that shows both streams.
pub(crate) fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A small repository with a README.
pub(crate) fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "# Demo\n\nversion 1.2.3\n").unwrap();
    dir
}

/// Stderr as text.
pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A runtime for a test's servers and clients (two workers), with the TLS crypto provider set.
pub(crate) fn rt() -> tokio::runtime::Runtime {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The mock server, with its default options.
pub(crate) fn mock(rt: &tokio::runtime::Runtime) -> toolloop_mock::MockServer {
    rt.block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap()
}

/// A call the mock makes (`MockOptions::script`).
pub(crate) fn call(name: &str, arguments: Value) -> toolloop_mock::ScriptCall {
    toolloop_mock::ScriptCall {
        name: name.into(),
        arguments,
    }
}

/// The mock server, making exactly the calls of `script`, round by round.
pub(crate) fn scripted_mock(
    rt: &tokio::runtime::Runtime,
    script: Vec<Vec<toolloop_mock::ScriptCall>>,
) -> toolloop_mock::MockServer {
    rt.block_on(toolloop_mock::start(toolloop_mock::MockOptions {
        script,
        ..toolloop_mock::MockOptions::default()
    }))
    .unwrap()
}

/// What a child process writes to a stream, read as it comes (by a thread of its own).
pub(crate) struct Transcript {
    chunks: Receiver<Vec<u8>>,
    /// Everything read so far.
    pub seen: String,
}

impl Transcript {
    /// Starts reading `stream`.
    pub(crate) fn of(mut stream: impl Read + Send + 'static) -> Transcript {
        let (tx, chunks) = std::sync::mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Transcript {
            chunks,
            seen: String::new(),
        }
    }

    /// Waits at most 100 ms for more, and adds what came to [`Transcript::seen`].
    pub(crate) fn poll(&mut self) {
        if let Ok(b) = self.chunks.recv_timeout(Duration::from_millis(100)) {
            self.seen.push_str(&String::from_utf8_lossy(&b));
        }
    }

    /// Waits until `what` has been seen `count` times; panics, showing what was seen, after
    /// `limit`.
    pub(crate) fn wait_for(&mut self, what: &str, count: usize, limit: Duration) {
        let start = Instant::now();
        while self.seen.matches(what).count() < count {
            assert!(
                start.elapsed() < limit,
                "no `{what}` (x{count}) in: {}",
                self.seen
            );
            self.poll();
        }
    }
}

/// A running `toolloop serve`, its stderr collected; killed when dropped.
pub(crate) struct Served {
    child: Child,
    /// Where it serves, as it says on stderr (`http://127.0.0.1:PORT/v1`).
    pub address: String,
    stderr: Arc<Mutex<String>>,
}

impl Served {
    /// Starts `toolloop serve ARGS` in `dir` with `env` (and a key for the provider), and waits
    /// for the line that says where it serves: what follows `announces` on it.
    pub(crate) fn start(
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        announces: &str,
    ) -> Served {
        let mut c = command(&[&["serve"], args].concat(), dir);
        c.env("OPENAI_API_KEY", "test")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("the binary starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        let announces = announces.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.split(announces.as_str()).nth(1) {
                    let _ = tx.send(at.to_string());
                }
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let address = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("the server did not start: {}", log.lock().unwrap());
            }
        };
        Served {
            child,
            address,
            stderr: log,
        }
    }

    /// The URL of `path` (`/v1/models`) on the server.
    pub(crate) fn url(&self, path: &str) -> String {
        let scheme = self.address.find("://").map_or(0, |at| at + 3);
        let origin = match self.address[scheme..].find('/') {
            Some(at) => &self.address[..scheme + at],
            None => &self.address,
        };
        format!("{origin}{path}")
    }

    /// What it wrote to stderr so far.
    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends SIGTERM.
    pub(crate) fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM");
    }

    /// Waits for the process to exit, at most `limit`; its exit code.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills it (SIGKILL) and waits for it.
    pub(crate) fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
