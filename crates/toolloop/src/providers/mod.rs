//! Provider adapters: each translates the message model to and from one wire format.
//!
//! Nothing outside an adapter knows a wire format.

use crate::model::{ApiError, ModelResponse};

#[cfg(feature = "http")]
pub mod anthropic;
#[cfg(feature = "http")]
pub mod gemini;
#[cfg(feature = "http")]
pub mod openai;
pub mod scripted;
pub mod test_model;
#[cfg(feature = "http")]
pub(crate) mod wire;

/// Checks a provider's base URL before anything is sent: an `http://` or `https://` URL with a
/// host, and without a query (`?…`) or a fragment (`#…`), since the adapter appends the API
/// path to it (a query would end up before the path; a fragment is never sent and would swallow
/// the path). The error says what is wrong, for a message that names where the URL came from.
///
/// ```
/// use toolloop::providers::check_base_url;
/// assert!(check_base_url("http://127.0.0.1:8089/v1").is_ok());
/// assert!(check_base_url("http//localhost:8089").is_err());
/// assert!(check_base_url("ftp://example.com").is_err());
/// assert!(check_base_url("https://example.com/v1?key=abc").is_err());
/// // The refusal never repeats a key or a password the URL carries.
/// let e = check_base_url("https://me:hunter2@example.com/v1?key=sekrit").unwrap_err();
/// assert!(!e.contains("hunter2") && !e.contains("sekrit"), "{e}");
/// ```
#[cfg(feature = "http")]
pub fn check_base_url(url: &str) -> Result<(), String> {
    const EXPECTED: &str = "expected an http:// or https:// URL with a host, like \
                            https://api.example.com/v1";
    let raw = url.trim();
    // What the messages show: never a password or a key the URL carries.
    let shown = crate::redact::redact_url_credentials(raw);
    let url = shown.as_str();
    let parsed = match reqwest::Url::parse(raw) {
        Ok(u) => u,
        Err(e) => return Err(format!("`{url}` is not a URL ({e}); {EXPECTED}")),
    };
    match parsed.scheme() {
        "http" | "https" => {}
        scheme if !raw.contains("://") => {
            return Err(format!(
                "`{url}` has no scheme (it reads as the scheme `{scheme}:`); {EXPECTED} \
                 (http://{url}?)"
            ));
        }
        scheme => {
            return Err(format!(
                "`{url}` uses the scheme `{scheme}`: the providers speak HTTP; {EXPECTED}"
            ));
        }
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{url}` has no host; {EXPECTED}"));
    }
    if parsed.query().is_some() {
        return Err(format!(
            "`{url}` has a query (`?…`): the API path is appended to the base URL, so the query \
             would end up before it; give the URL without it"
        ));
    }
    if parsed.fragment().is_some() {
        return Err(format!(
            "`{url}` has a fragment (`#…`): it is never sent, and the API path appended to the \
             base URL would be lost in it; give the URL without it"
        ));
    }
    Ok(())
}

/// What an adapter makes of one recorded response body: the response, and the error the body
/// reported (an HTTP error body, or an error event inside a stream). Used by the conformance
/// tests, which feed recorded bodies byte for byte.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decoded {
    /// What arrived (for an error, whatever came before it).
    pub response: ModelResponse,
    /// The error, if the body reported one.
    pub error: Option<ApiError>,
}
