//! The provider side of the adapters' wire tests: a server on 127.0.0.1 that replays canned
//! replies in order (or makes each with a function) and records every request it is sent.

#![allow(dead_code)]
use axum::body::Body;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// One request the server was sent.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// The path and query.
    pub uri: String,
    pub headers: HeaderMap,
    /// The body as JSON (`null` when it is not JSON).
    pub body: Value,
}

/// One canned reply.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, &'static str)>,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    /// A JSON body with this status.
    pub(crate) fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            headers: vec![],
            content_type: "application/json",
            body: body.to_string(),
        }
    }

    /// A 200 Server-Sent Events body, as written.
    pub(crate) fn sse(body: String) -> Reply {
        Reply {
            status: 200,
            headers: vec![],
            content_type: "text/event-stream",
            body,
        }
    }

    /// With one more header.
    pub(crate) fn header(mut self, name: &'static str, value: &'static str) -> Reply {
        self.headers.push((name, value));
        self
    }

    fn response(&self) -> Response {
        let mut b = Response::builder()
            .status(self.status)
            .header("content-type", self.content_type);
        for (k, v) in &self.headers {
            b = b.header(*k, *v);
        }
        b.body(Body::from(self.body.clone())).unwrap()
    }
}

/// A running server: what it was sent.
#[derive(Clone, Default)]
pub(crate) struct Server {
    seen: Arc<Mutex<Vec<Request>>>,
}

impl Server {
    /// The requests so far, in order.
    pub(crate) fn requests(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests came.
    pub(crate) fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// Serves `replies` in order (the last one repeats, on any path); returns the base URL
/// (`http://127.0.0.1:PORT`) and the server.
pub(crate) async fn serve(replies: Vec<Reply>) -> (String, Server) {
    serve_with(move |n| replies[(n as usize).min(replies.len() - 1)].response()).await
}

/// Serves the response `reply` makes for request number `n` (0-based), on any path.
pub(crate) async fn serve_with(
    reply: impl Fn(u32) -> Response + Send + Sync + 'static,
) -> (String, Server) {
    let server = Server::default();
    let state = (server.clone(), Arc::new(reply));
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: String| {
        let (server, reply) = state.clone();
        async move {
            let n = {
                let mut seen = server.seen.lock().unwrap();
                seen.push(Request {
                    uri: uri.to_string(),
                    headers,
                    body: serde_json::from_str(&body).unwrap_or(Value::Null),
                });
                seen.len() as u32 - 1
            };
            reply(n)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), server)
}
