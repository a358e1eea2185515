//! Calls over Restate's HTTP ingress (and its admin API): start runs, wait for their outcomes,
//! decide approvals, cancel.
//!
//! A run is the invocation `POST {ingress}/toolloop/{run_id}/run`, sent with the run id as its
//! idempotency key: asking again for the same run id attaches to the same run (its outcome,
//! once it has one) rather than starting another.

use crate::service::{RunRequest, SERVICE, WaitingApproval};
use std::time::Duration;
use toolloop::approval::{Answer, PendingApproval};
use toolloop::{Message, Outcome};

/// Why a call over the ingress failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A URL or a run id that cannot be used.
    #[error("{0}")]
    Usage(String),
    /// Restate could not be reached, or the connection broke.
    #[error("cannot reach Restate at {url}: {message}")]
    Transport {
        /// The URL called.
        url: String,
        /// What happened.
        message: String,
    },
    /// Restate answered with an error status.
    #[error("Restate answered {status} to {url}: {body}")]
    Status {
        /// The URL called.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the answer's body.
        body: String,
    },
    /// The answer was not what was expected.
    #[error("unexpected answer from {url}: {message}")]
    Invalid {
        /// The URL called.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// No call of the run waits for a decision with this id.
    #[error("run {run_id}: no call {call_id} waits for approval (waiting: {waiting:?})")]
    NotWaiting {
        /// The run.
        run_id: String,
        /// The call asked about.
        call_id: String,
        /// The calls that do wait.
        waiting: Vec<String>,
    },
}

/// A run id fit for a URL path and a Restate key: 1 to 128 of `A-Z a-z 0-9 _ - .`.
pub fn check_run_id(run_id: &str) -> Result<(), ClientError> {
    let ok = (1..=128).contains(&run_id.len())
        && run_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && run_id != "."
        && run_id != "..";
    if ok {
        Ok(())
    } else {
        Err(ClientError::Usage(format!(
            "run id {run_id:?}: expected 1 to 128 letters, digits, `_`, `-` or `.`"
        )))
    }
}

fn url(base: &str, segments: &[&str]) -> Result<url::Url, ClientError> {
    let mut url = url::Url::parse(base)
        .map_err(|e| ClientError::Usage(format!("{base:?} is not a URL: {e}")))?;
    url.path_segments_mut()
        .map_err(|_| ClientError::Usage(format!("{base:?} cannot be a base URL")))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

fn client() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            // reqwest builds its TLS configuration from the process's default crypto provider.
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default()
        })
        .clone()
}

async fn send<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
    url: &url::Url,
) -> Result<T, ClientError> {
    let transport = |e: reqwest::Error| ClientError::Transport {
        url: url.to_string(),
        message: e.to_string(),
    };
    let response = request.send().await.map_err(transport)?;
    let status = response.status();
    let body = response.bytes().await.map_err(transport)?;
    if !status.is_success() {
        return Err(ClientError::Status {
            url: url.to_string(),
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body[..body.len().min(1000)]).into_owned(),
        });
    }
    // An empty answer is JSON `null` (for calls that answer nothing).
    let body: &[u8] = if body.is_empty() { b"null" } else { &body };
    serde_json::from_slice(body).map_err(|e| ClientError::Invalid {
        url: url.to_string(),
        message: e.to_string(),
    })
}

/// Runs `messages` as run `run_id` through Restate and waits for its outcome (of a run with
/// this id started before: attached to it). `ingress_url` is Restate's HTTP ingress
/// (`http://127.0.0.1:8080`).
pub async fn invoke(
    ingress_url: &str,
    run_id: &str,
    messages: Vec<Message>,
) -> Result<Outcome, ClientError> {
    check_run_id(run_id)?;
    let url = url(ingress_url, &[SERVICE, run_id, "run"])?;
    let request = client()
        .post(url.clone())
        .header("idempotency-key", run_id)
        .json(&RunRequest::new(messages));
    send(request, &url).await
}

/// Starts run `run_id` without waiting for it; returns Restate's invocation id (for
/// [`attach`] and [`cancel`]). Starting the same run id again returns the same invocation.
pub async fn start(
    ingress_url: &str,
    run_id: &str,
    messages: Vec<Message>,
) -> Result<String, ClientError> {
    check_run_id(run_id)?;
    let url = url(ingress_url, &[SERVICE, run_id, "run", "send"])?;
    let request = client()
        .post(url.clone())
        .header("idempotency-key", run_id)
        .json(&RunRequest::new(messages));
    #[derive(serde::Deserialize)]
    struct Sent {
        #[serde(rename = "invocationId")]
        invocation_id: String,
    }
    let sent: Sent = send(request, &url).await?;
    Ok(sent.invocation_id)
}

/// Waits for the outcome of the invocation `invocation_id` (from [`start`]).
pub async fn attach(ingress_url: &str, invocation_id: &str) -> Result<Outcome, ClientError> {
    let url = url(
        ingress_url,
        &["restate", "invocation", invocation_id, "attach"],
    )?;
    send(client().get(url.clone()), &url).await
}

/// The calls of run `run_id` that wait for a person (none when the run waits for nothing).
pub async fn pending(ingress_url: &str, run_id: &str) -> Result<Vec<WaitingApproval>, ClientError> {
    check_run_id(run_id)?;
    let url = url(ingress_url, &[SERVICE, run_id, "pending"])?;
    send(client().post(url.clone()), &url).await
}

/// Answers the calls of run `run_id` that wait for a person: those named in `call_ids`, or all
/// of them with `None`. Returns the calls answered; the run goes on once all its waiting calls
/// are answered. A call id that does not wait is an error, and then nothing is answered.
pub async fn decide(
    ingress_url: &str,
    run_id: &str,
    call_ids: Option<&[String]>,
    answer: Answer,
) -> Result<Vec<PendingApproval>, ClientError> {
    let waiting = pending(ingress_url, run_id).await?;
    let chosen: Vec<&WaitingApproval> = match call_ids {
        None => waiting.iter().collect(),
        Some(ids) => {
            let mut chosen = Vec::new();
            for id in ids {
                match waiting.iter().find(|w| &w.pending.call.id == id) {
                    Some(w) => chosen.push(w),
                    None => {
                        return Err(ClientError::NotWaiting {
                            run_id: run_id.to_string(),
                            call_id: id.clone(),
                            waiting: waiting.iter().map(|w| w.pending.call.id.clone()).collect(),
                        });
                    }
                }
            }
            chosen
        }
    };
    for w in &chosen {
        resolve(ingress_url, &w.awakeable_id, &answer).await?;
    }
    Ok(chosen.into_iter().map(|w| w.pending.clone()).collect())
}

/// Resolves one awakeable with `answer`
/// (`POST {ingress}/restate/awakeables/{id}/resolve`).
pub async fn resolve(
    ingress_url: &str,
    awakeable_id: &str,
    answer: &Answer,
) -> Result<(), ClientError> {
    let url = url(
        ingress_url,
        &["restate", "awakeables", awakeable_id, "resolve"],
    )?;
    let request = client().post(url.clone()).json(answer);
    let _: serde_json::Value = send(request, &url).await?;
    Ok(())
}

/// Cancels the invocation `invocation_id` through the admin API at `admin_url`
/// (`PATCH {admin}/invocations/{id}/cancel`): the run stops at its next step, with its
/// transcript and the stop reason `cancelled`.
pub async fn cancel(admin_url: &str, invocation_id: &str) -> Result<(), ClientError> {
    let url = url(admin_url, &["invocations", invocation_id, "cancel"])?;
    let _: serde_json::Value = send(client().patch(url.clone()), &url).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_checked() {
        assert!(check_run_id("run_0193-a.b").is_ok());
        for bad in ["", "a/b", "a b", "..", "é", &"x".repeat(129)] {
            let e = check_run_id(bad).unwrap_err().to_string();
            assert!(e.contains("expected 1 to 128"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn urls_are_built_from_segments() {
        let u = url("http://127.0.0.1:8080/", &["toolloop", "r1", "run"]).unwrap();
        assert_eq!(u.as_str(), "http://127.0.0.1:8080/toolloop/r1/run");
        let u = url("http://h:1/base", &["a", "b c"]).unwrap();
        assert_eq!(u.as_str(), "http://h:1/base/a/b%20c");
        assert!(url("not a url", &["a"]).is_err());
    }
}
