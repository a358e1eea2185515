//! A real Restate server for tests: the binary of the npm package installed by
//! `scripts/npm-install` into `tools/npm/node_modules`, on free ports of 127.0.0.1 with a
//! temporary data directory.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary of this platform's npm package, when installed.
pub(crate) fn server_binary() -> Option<PathBuf> {
    let os = match std::env::consts::OS {
        "linux" => "linux",
        "macos" => "darwin",
        _ => return None,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        _ => return None,
    };
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../../tools/npm/node_modules/@restatedev/restate-server-{os}-{arch}/bin/restate-server"
    ));
    path.is_file().then_some(path)
}

/// A free TCP port of 127.0.0.1 (free when asked), never one this process was given before.
/// A port is free again from the moment it is given until the server or worker it is for binds
/// it, and the system hands the same port out again soon and often; the two lanes of tests ask
/// at once, and workers bind with `SO_REUSEPORT`, so that two lanes' workers would share a port
/// (and serve each other's server) without an error.
pub(crate) fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

/// A running Restate server, killed on drop.
pub(crate) struct RestateServer {
    child: Child,
    pub ingress: String,
    pub admin: String,
    pub dir: tempfile::TempDir,
}

impl RestateServer {
    /// Starts the server and waits until its admin API and ingress answer.
    pub(crate) fn start(binary: &std::path::Path) -> RestateServer {
        let dir = tempfile::tempdir().unwrap();
        let (ingress, admin, node) = (free_port(), free_port(), free_port());
        let log = std::fs::File::create(dir.path().join("restate.log")).unwrap();
        let child = Command::new(binary)
            .args(["--no-logo", "--listen-mode", "tcp", "--node-name", "test"])
            .arg("--base-dir")
            .arg(dir.path().join("data"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(
                "RESTATE_INGRESS__BIND_ADDRESS",
                format!("127.0.0.1:{ingress}"),
            )
            .env("RESTATE_ADMIN__BIND_ADDRESS", format!("127.0.0.1:{admin}"))
            .env("RESTATE_BIND_ADDRESS", format!("127.0.0.1:{node}"))
            .env(
                "RESTATE_ADVERTISED_ADDRESS",
                format!("http://127.0.0.1:{node}"),
            )
            .env("RESTATE_DISABLE_TELEMETRY", "true")
            .env("RESTATE_DEFAULT_NUM_PARTITIONS", "4")
            // Several connections to a deployment, so that the workers sharing its address
            // each get some.
            .env(
                "RESTATE_WORKER__INVOKER__HTTP2_STREAMS_PER_CONNECTION_LIMIT",
                "8",
            )
            .env("RESTATE_LOG_FILTER", "warn")
            .env("RESTATE_LOG_DISABLE_ANSI_CODES", "true")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("the Restate server starts");
        let server = RestateServer {
            child,
            ingress: format!("http://127.0.0.1:{ingress}"),
            admin: format!("http://127.0.0.1:{admin}"),
            dir,
        };
        let until = Instant::now() + Duration::from_secs(60);
        let client = reqwest::blocking_client();
        for url in [
            format!("{}/health", server.admin),
            format!("{}/restate/health", server.ingress),
        ] {
            loop {
                if client(&url) {
                    break;
                }
                assert!(
                    Instant::now() < until,
                    "the Restate server did not answer at {url}: {}",
                    server.log()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        server
    }

    /// The server's log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("restate.log")).unwrap_or_default()
    }
}

impl Drop for RestateServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

mod reqwest {
    /// A check that a URL answers 200, on a small runtime of its own.
    pub(super) fn blocking_client() -> impl Fn(&str) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = super::http_client();
        move |url: &str| {
            rt.block_on(async {
                client
                    .get(url)
                    .timeout(std::time::Duration::from_secs(2))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            })
        }
    }
}

/// A reqwest client builder, with the process's TLS crypto provider installed first (reqwest
/// builds its TLS configuration from it, even for plain HTTP).
#[allow(dead_code)]
fn http_client_builder() -> ::reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    ::reqwest::Client::builder()
}

/// A reqwest client with the defaults.
#[allow(dead_code)]
fn http_client() -> ::reqwest::Client {
    http_client_builder()
        .build()
        .expect("the HTTP client builds")
}
