//! The streamable HTTP transport (rmcp's, on reqwest with rustls), with every answer checked
//! before rmcp reads it.
//!
//! rmcp turns an answer it cannot read into a failed send ("the server went away", and the
//! connection is dropped) when it is a JSON body, and drops it with a log line when it is an SSE
//! event, leaving the request waiting for the call timeout. [`Guarded`] reads each answer first:
//! a body or event that cannot be read (garbled, over [`crate::guard::MAX_MESSAGE_BYTES`],
//! nested too deep, of another content type) becomes a JSON-RPC error (code
//! [`crate::guard::UNREADABLE`]) for the request it answers, as [`crate::guard::forward`] does
//! for a child's stdout, so that the request fails at once saying why, and the connection stays
//! up.

use crate::guard::{self, MAX_MESSAGE_BYTES};
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::Sse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// How many redirects are followed (same origin, 307 and 308 only: they keep the body).
const MAX_REDIRECTS: usize = 10;

/// rmcp's transport for `url` with `headers` on every request. TLS is toolloop's
/// ([`toolloop::transport::tls::client_config`]): rustls's `ring` (installed as the process
/// default when none is), the system's roots read at the first `https://` connection, once per
/// process.
pub(crate) fn transport(
    url: &str,
    headers: &BTreeMap<String, String>,
) -> Result<rmcp::transport::StreamableHttpClientTransport<Guarded>, String> {
    let mut custom = HashMap::new();
    for (name, value) in headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header `{name}` is not a valid header name"))?;
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| format!("header `{name}`: the value is not a valid header value"))?;
        value.set_sensitive(true);
        custom.insert(header, value);
    }
    let tls = toolloop::transport::tls::client_config()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .redirect(same_origin_redirects())
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
    let config = StreamableHttpClientTransportConfig::with_uri(url)
        .custom_headers(custom)
        // An event carries its `data: ` prefix and fields besides the message.
        .max_sse_event_size(MAX_MESSAGE_BYTES + 1024)
        .max_json_response_size(MAX_MESSAGE_BYTES);
    Ok(rmcp::transport::StreamableHttpClientTransport::with_client(
        Guarded(client),
        config,
    ))
}

/// rmcp's redirect policy for its own client: a same-origin 307 or 308 is followed (the
/// message goes along), anything else is returned as it is (a 301 to 303 would lose the body;
/// another origin would receive the session and the configured headers).
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt.previous().first().is_some_and(|first| {
            first.scheme() == attempt.url().scheme()
                && first.host_str() == attempt.url().host_str()
                && first.port_or_known_default() == attempt.url().port_or_known_default()
        });
        if keeps_body && same_origin && attempt.previous().len() <= MAX_REDIRECTS {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// reqwest's client for rmcp, with every answer checked first (see the module docs).
#[derive(Clone)]
pub(crate) struct Guarded(reqwest::Client);

type Error = StreamableHttpError<reqwest::Error>;
type Events = BoxStream<'static, Result<Sse, SseError>>;

/// The id of the request `message` is, if it is one (an answer is awaited for it).
fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
        _ => None,
    }
}

/// The error answer to `id`, as rmcp reads it.
fn error_message(id: &RequestId, why: &str) -> Option<ServerJsonRpcMessage> {
    serde_json::from_value(guard::error_for(id, why)).ok()
}

/// Why a failed POST failed because of what the server answered (and not the network).
fn unreadable_answer(e: &Error) -> Option<String> {
    match e {
        StreamableHttpError::ResponseBodyTooLarge { .. } => Some(guard::too_large()),
        StreamableHttpError::Deserialize(e) => Some(format!(
            "the answer is not a message toolloop can read ({e})"
        )),
        StreamableHttpError::UnexpectedServerResponse(why) if !why.starts_with("HTTP ") => Some(
            format!("the answer is not a message toolloop can read ({why})"),
        ),
        StreamableHttpError::UnexpectedContentType(ct) => Some(format!(
            "the answer is neither JSON nor an event stream (content type {})",
            ct.as_deref().unwrap_or("none")
        )),
        _ => None,
    }
}

/// Whether rmcp reads `sse` as a message: an event without a type (or of type `message`) whose
/// data is JSON text (an object or an array; a priming event's empty data, a `ping` or other
/// text between messages is not, and rmcp passes over it, as toolloop does).
fn meant_as_message(sse: &Sse) -> Option<&str> {
    if !matches!(sse.event.as_deref(), None | Some("") | Some("message")) {
        return None;
    }
    let data = sse.data.as_deref()?;
    data.trim_start().starts_with(['{', '[']).then_some(data)
}

/// `events` with each message that cannot be read replaced by an error answer: for the request
/// it answers, or `request` (the one whose POST opened the stream) when it does not say.
fn checked_events(events: Events, request: Option<RequestId>) -> Events {
    events
        .map(move |event| match event {
            Ok(mut sse) => {
                let Some(data) = meant_as_message(&sse) else {
                    return Ok(sse);
                };
                if let Some((id, why)) = guard::unreadable(data.as_bytes())
                    && let Some(id) = id.or_else(|| request.clone())
                {
                    tracing::debug!("an unreadable event was replaced by an error: {why}");
                    sse.data = Some(guard::error_for(&id, &why).to_string());
                }
                Ok(sse)
            }
            // rmcp's own limit on an event ends the stream with this error (its type is private).
            Err(e) if e.to_string().contains("exceeded the maximum size") => match &request {
                Some(id) => {
                    Ok(Sse::default().data(guard::error_for(id, &guard::too_large()).to_string()))
                }
                None => Err(e),
            },
            Err(e) => Err(e),
        })
        .boxed()
}

/// A POST as rmcp asks for it: the URI, the message, the session, the `Authorization` header
/// and the custom headers.
type Post = (
    Arc<str>,
    ClientJsonRpcMessage,
    Option<Arc<str>>,
    Option<String>,
    HashMap<HeaderName, HeaderValue>,
);

impl Guarded {
    /// Sends a POST through rmcp's client within `limits`; an answer toolloop cannot read
    /// becomes an error answer to the request.
    async fn post(
        &self,
        (uri, message, session, auth, headers): Post,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let request = request_id(&message);
        let answer = self
            .0
            .post_message_with_response_limits(uri, message, session, auth, headers, limits)
            .await;
        match answer {
            Ok(StreamableHttpPostResponse::Sse(events, session)) => Ok(
                StreamableHttpPostResponse::Sse(checked_events(events, request), session),
            ),
            Err(e) => {
                let replaced = request.as_ref().and_then(|id| {
                    let why = unreadable_answer(&e)?;
                    tracing::debug!("an unreadable answer was replaced by an error: {why}");
                    error_message(id, &why)
                });
                match replaced {
                    Some(error) => Ok(StreamableHttpPostResponse::Json(error, None)),
                    None => Err(e),
                }
            }
            other => other,
        }
    }
}

impl StreamableHttpClient for Guarded {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let post = (uri, message, session_id, auth_header, custom_headers);
        self.post(post, StreamableHttpResponseLimits::default())
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        let post = (uri, message, session_id, auth_header, custom_headers);
        self.post(post, limits).await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let post = (uri, message, session_id, auth_header, custom_headers);
        self.post(post, limits).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Events, Error> {
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            MAX_MESSAGE_BYTES + 1024,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Events, Error> {
        let events = self
            .0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await?;
        Ok(checked_events(events, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn through(events: Vec<Result<Sse, SseError>>, request: Option<RequestId>) -> Vec<Sse> {
        checked_events(futures::stream::iter(events).boxed(), request)
            .filter_map(|e| async move { e.ok() })
            .collect()
            .await
    }

    #[tokio::test]
    async fn only_unreadable_messages_are_replaced() {
        let ok = r#"{"jsonrpc":"2.0","id":3,"result":{}}"#;
        let garbled = r#"{"jsonrpc":"2.0","id":4,"result":"#;
        let events = vec![
            // A priming event (an id, empty data), a ping, a control event: passed over.
            Ok(Sse::default().id("e1").data("")),
            Ok(Sse::default().data("ping")),
            Ok(Sse::default().event("endpoint").data("{not json")),
            Ok(Sse::default().data(ok)),
            Ok(Sse::default().event("message").data(garbled)),
            Ok(Sse::default().data("[1, 2")),
        ];
        let out = through(events, Some(RequestId::Number(9))).await;
        let data: Vec<&str> = out.iter().map(|e| e.data.as_deref().unwrap()).collect();
        assert_eq!(&data[..4], ["", "ping", "{not json", ok]);
        // An answer with a readable id fails that request; one without, the stream's request.
        let e: serde_json::Value = serde_json::from_str(data[4]).unwrap();
        assert_eq!(
            (e["id"].as_i64(), e["error"]["code"].as_i64()),
            (Some(4), Some(-32099))
        );
        let e: serde_json::Value = serde_json::from_str(data[5]).unwrap();
        assert_eq!(e["id"].as_i64(), Some(9));
        // On a stream no request opened (the GET stream), such a message passes (rmcp drops it).
        let out = through(vec![Ok(Sse::default().data("[1, 2"))], None).await;
        assert_eq!(out[0].data.as_deref(), Some("[1, 2"));
    }
}
