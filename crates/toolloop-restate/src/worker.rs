//! A worker: the HTTP/2 endpoint the Restate server calls to run the agent's invocations.
//!
//! Several workers may listen on one address ([`Worker::bind`] sets `SO_REUSEPORT`): the
//! kernel spreads Restate's connections over them, and when one dies, Restate's retry of its
//! invocations connects to another, which replays their journals. (Restate pins an invocation
//! to the deployment, the URL, it started on: a fleet behind one URL, one address or one load
//! balancer, is how a run moves to another worker.)

use crate::service::RunService;
use restate_sdk::endpoint::Endpoint;
use restate_sdk::http_server::HttpServer;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use toolloop::Agent;

/// Why a worker could not start or register.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// [`Worker::bind`] was called outside a Tokio runtime.
    #[error("a worker must be bound inside a Tokio runtime (call Worker::bind from async code)")]
    NoRuntime,
    /// The admin API refused the deployment, or could not be reached.
    #[error("cannot register {endpoint} with the Restate admin API at {admin}: {message}")]
    Register {
        /// The admin URL.
        admin: String,
        /// The worker's URL.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
}

/// A bound worker, not yet serving.
pub struct Worker {
    listener: tokio::net::TcpListener,
}

impl Worker {
    /// Listens on `addr` (port 0: a free port), sharing it with other workers on the same
    /// address (`SO_REUSEPORT` where the system has it). Must be called inside a Tokio
    /// runtime ([`WorkerError::NoRuntime`] otherwise).
    pub fn bind(addr: SocketAddr) -> Result<Worker, WorkerError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(WorkerError::NoRuntime);
        }
        let bind = || -> std::io::Result<tokio::net::TcpListener> {
            let socket = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            socket.set_reuse_address(true)?;
            #[cfg(all(unix, not(any(target_os = "solaris", target_os = "illumos"))))]
            socket.set_reuse_port(true)?;
            socket.set_nonblocking(true)?;
            socket.bind(&addr.into())?;
            socket.listen(1024)?;
            tokio::net::TcpListener::from_std(socket.into())
        };
        bind()
            .map(|listener| Worker { listener })
            .map_err(|source| WorkerError::Bind { addr, source })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `agent` as the virtual object [`crate::SERVICE`] until `shutdown` completes.
    pub async fn serve(self, agent: Agent, shutdown: impl Future) {
        let endpoint = Endpoint::builder().bind(RunService::new(agent)).build();
        HttpServer::new(endpoint)
            .serve_with_cancel(self.listener, shutdown)
            .await;
    }
}

/// Binds `addr` and serves `agent` until `shutdown` completes (see [`Worker`]).
pub async fn serve(
    agent: Agent,
    addr: SocketAddr,
    shutdown: impl Future,
) -> Result<(), WorkerError> {
    Worker::bind(addr)?.serve(agent, shutdown).await;
    Ok(())
}

/// Registers the worker at `endpoint_url` (the URL the Restate server reaches it at) with the
/// admin API at `admin_url`: Restate asks the worker what it serves. Registering the same URL
/// again (a second worker on the same address) is accepted. Tries for up to `patience` while
/// the worker or the server is still starting.
pub async fn register(
    admin_url: &str,
    endpoint_url: &str,
    patience: Duration,
) -> Result<(), WorkerError> {
    let fail = |message: String| WorkerError::Register {
        admin: admin_url.to_string(),
        endpoint: endpoint_url.to_string(),
        message,
    };
    let url = url::Url::parse(admin_url)
        .and_then(|u| u.join("deployments"))
        .map_err(|e| fail(format!("the admin URL is not a URL: {e}")))?;
    // reqwest builds its TLS configuration from the process's default crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let body = serde_json::json!({ "uri": endpoint_url, "force": true });
    let until = tokio::time::Instant::now() + patience;
    loop {
        let tried = client
            .post(url.clone())
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        let message = match tried {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                format!("{status}: {}", text.chars().take(500).collect::<String>())
            }
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= until {
            return Err(fail(message));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_outside_a_runtime_is_an_error_not_a_panic() {
        let err = Worker::bind("127.0.0.1:0".parse().unwrap()).err();
        assert!(matches!(err, Some(WorkerError::NoRuntime)), "{err:?}");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _entered = rt.enter();
        let worker = Worker::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_ne!(worker.local_addr().unwrap().port(), 0);
    }
}
