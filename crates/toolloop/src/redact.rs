//! Keeping secrets out of error messages.
//!
//! A model server's error can repeat what it was sent: a `401` body that quotes the key, a URL
//! with credentials in it, a validation error that echoes a header. Errors travel far (the
//! terminal, `toolloop run --json`, events, the run log and the session store), so the HTTP
//! transport passes every text a server sends into an error through a [`Redactor`] first: each
//! configured secret, and credentials written in URLs, become [`REDACTED`].
//!
//! A secret is recognised as it is, percent-encoded (upper- or lower-case hex, as a server
//! quoting a URL would write it), JSON-escaped, and, when a message was cut short (`…`), by the
//! beginning of it left before the cut. Credentials in URLs are the user information
//! (`https://user:password@host`) and the values of query parameters that carry keys (`key`,
//! `api_key`, `access_token`, `token`, `sig`, …), whatever the key.
//!
//! ```
//! use toolloop::redact::Redactor;
//!
//! let r = Redactor::new().with_secret("sk-live-1234567890");
//! assert_eq!(
//!     r.redact("Incorrect API key provided: sk-live-1234567890"),
//!     "Incorrect API key provided: [redacted]"
//! );
//! assert_eq!(
//!     r.redact("see https://bob:hunter2@example.com/v1?key=abc&x=1"),
//!     "see https://[redacted]@example.com/v1?key=[redacted]&x=1"
//! );
//! ```

use crate::model::{ApiError, ModelError};
use std::borrow::Cow;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Secrets shorter than this many characters are not looked for: replacing every `abc` in a
/// message would garble it, and so short a value protects nothing.
pub const MIN_SECRET_CHARS: usize = 4;

/// Query parameters whose values are credentials, compared without regard to case.
const SECRET_PARAMS: &[&str] = &[
    "key",
    "api_key",
    "apikey",
    "api-key",
    "x-api-key",
    "x-goog-api-key",
    "access_token",
    "token",
    "auth",
    "password",
    "secret",
    "client_secret",
    "sig",
    "signature",
];

/// Replaces secrets in text with [`REDACTED`]: the configured ones, in every form a server may
/// write them back, and credentials in URLs. Its `Debug` form shows how many secrets it holds,
/// never them.
#[derive(Clone, Default)]
pub struct Redactor {
    /// The forms to look for, longest first (so a longer form is replaced before a shorter one
    /// that it contains).
    needles: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("forms", &self.needles.len())
            .finish()
    }
}

impl Redactor {
    /// A redactor with no secrets (it still removes credentials from URLs).
    pub fn new() -> Self {
        Redactor::default()
    }

    /// Adds a secret, builder style.
    pub fn with_secret(mut self, secret: &str) -> Self {
        self.add_secret(secret);
        self
    }

    /// Adds a secret: it, its percent-encoded and JSON-escaped forms. Surrounding whitespace is
    /// ignored; a secret shorter than [`MIN_SECRET_CHARS`] characters is not added.
    pub fn add_secret(&mut self, secret: &str) {
        let secret = secret.trim();
        if secret.chars().count() < MIN_SECRET_CHARS {
            return;
        }
        let json = serde_json::to_string(secret).unwrap_or_default();
        let json = json
            .strip_prefix('"')
            .and_then(|j| j.strip_suffix('"'))
            .unwrap_or(secret);
        let forms = [
            secret.to_string(),
            percent_encode(secret, true),
            percent_encode(secret, false),
            json.to_string(),
            json.replace('/', "\\/"),
        ];
        for form in forms {
            if !self.needles.contains(&form) {
                self.needles.push(form);
            }
        }
        self.needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
    }

    /// Whether no secret was added.
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// The secrets of one HTTP request: the value of every header marked sensitive, or named
    /// `authorization`, `proxy-authorization`, `x-api-key`, `api-key` or `x-goog-api-key` (and,
    /// for an `Authorization: Bearer …` or `Basic …`, the credential alone), and the password
    /// and secret query values written in the URL.
    pub fn for_request(url: &str, headers: &http::header::HeaderMap) -> Self {
        const NAMES: &[&str] = &[
            "authorization",
            "proxy-authorization",
            "x-api-key",
            "api-key",
            "x-goog-api-key",
        ];
        let mut r = Redactor::new();
        for (name, value) in headers {
            if !(value.is_sensitive() || NAMES.contains(&name.as_str())) {
                continue;
            }
            let Ok(text) = value.to_str() else { continue };
            r.add_secret(text);
            if let Some((scheme, credential)) = text.trim().split_once(' ')
                && ["bearer", "basic", "token"].contains(&scheme.to_ascii_lowercase().as_str())
            {
                r.add_secret(credential);
            }
        }
        if let Ok(parsed) = url::Url::parse(url) {
            if let Some(password) = parsed.password() {
                r.add_secret(password);
            }
            for (name, value) in parsed.query_pairs() {
                if is_secret_param(&name) {
                    r.add_secret(&value);
                }
            }
        }
        r
    }

    /// `text` with every secret and every credential in a URL replaced by [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        let mut out = Cow::Borrowed(text);
        for needle in &self.needles {
            if out.contains(needle.as_str()) {
                out = Cow::Owned(out.replace(needle.as_str(), REDACTED));
            }
        }
        let out = self.redact_cut_tails(&out);
        redact_url_credentials(&out)
    }

    /// Replaces what is left of a secret right before a `…` (a message cut short in the middle
    /// of a secret), when that is at least [`MIN_SECRET_CHARS`] characters of its beginning.
    fn redact_cut_tails(&self, text: &str) -> String {
        if !text.contains('…') || self.needles.is_empty() {
            return text.to_string();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find('…') {
            let before = &rest[..at];
            let cut = self
                .needles
                .iter()
                .filter_map(|n| longest_prefix_suffix(before, n))
                .max()
                .unwrap_or(0);
            out.push_str(&before[..before.len() - cut]);
            if cut > 0 {
                out.push_str(REDACTED);
            }
            out.push('…');
            rest = &rest[at + '…'.len_utf8()..];
        }
        out.push_str(rest);
        out
    }

    /// `bytes` with every secret replaced by [`REDACTED`] (credentials in URLs are left for
    /// [`Redactor::redact`], on the text made from them).
    pub fn redact_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        let mut out = Cow::Borrowed(bytes);
        for needle in &self.needles {
            let needle = needle.as_bytes();
            if find(&out, needle, 0).is_none() {
                continue;
            }
            let mut replaced = Vec::with_capacity(out.len());
            let mut from = 0;
            while let Some(at) = find(&out, needle, from) {
                replaced.extend_from_slice(&out[from..at]);
                replaced.extend_from_slice(REDACTED.as_bytes());
                from = at + needle.len();
            }
            replaced.extend_from_slice(&out[from..]);
            out = Cow::Owned(replaced);
        }
        out
    }

    /// An API error with its message, type and code redacted.
    pub fn redact_api_error(&self, mut e: ApiError) -> ApiError {
        e.message = self.redact(&e.message);
        e.error_type = e.error_type.map(|t| self.redact(&t));
        e.code = e.code.map(|c| self.redact(&c));
        e
    }

    /// A model error with every text in it redacted.
    pub fn redact_error(&self, e: ModelError) -> ModelError {
        match e {
            ModelError::Api(a) => ModelError::Api(self.redact_api_error(a)),
            ModelError::Transport { message, retryable } => ModelError::Transport {
                message: self.redact(&message),
                retryable,
            },
            ModelError::StreamInterrupted(m) => ModelError::StreamInterrupted(self.redact(&m)),
            ModelError::InvalidResponse(m) => ModelError::InvalidResponse(self.redact(&m)),
            ModelError::ToolsUnsupported(m) => ModelError::ToolsUnsupported(self.redact(&m)),
            ModelError::ContextOverflow(mut o) => {
                o.message = self.redact(&o.message);
                o.code = o.code.map(|c| self.redact(&c));
                ModelError::ContextOverflow(o)
            }
            ModelError::Config(m) => ModelError::Config(self.redact(&m)),
            ModelError::Other(m) => ModelError::Other(self.redact(&m)),
            other @ ModelError::BodyTooLarge { .. } => other,
        }
    }
}

/// Redacts text that arrives in pieces (a streamed answer): a secret split across pieces is
/// still replaced, because the end of what was pushed is held back while it could be the
/// beginning of a secret, and given out with the next piece (or by [`StreamRedactor::finish`]).
///
/// ```
/// use toolloop::redact::{Redactor, StreamRedactor};
///
/// let r = Redactor::new().with_secret("sk-live-1234567890");
/// let mut s = StreamRedactor::new(&r);
/// let mut out = String::new();
/// for piece in ["the key is sk-li", "ve-12345", "67890, done"] {
///     out.push_str(&s.push(piece));
/// }
/// out.push_str(&s.finish());
/// assert_eq!(out, "the key is [redacted], done");
/// ```
#[derive(Debug)]
pub struct StreamRedactor<'a> {
    redactor: &'a Redactor,
    held: String,
}

impl<'a> StreamRedactor<'a> {
    /// A stream redactor with the secrets of `redactor`.
    pub fn new(redactor: &'a Redactor) -> Self {
        StreamRedactor {
            redactor,
            held: String::new(),
        }
    }

    /// Takes the next piece; returns the redacted text that can be given out now.
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        let redacted = self.redactor.redact(&self.held);
        let keep = self
            .redactor
            .needles
            .iter()
            .map(|n| longest_prefix_suffix_any(&redacted, n))
            .max()
            .unwrap_or(0);
        let cut = redacted.len() - keep;
        self.held = redacted[cut..].to_string();
        let mut out = redacted;
        out.truncate(cut);
        out
    }

    /// The rest held back (no secret: what was held turned out not to be one).
    pub fn finish(self) -> String {
        self.redactor.redact(&self.held)
    }
}

/// The length in bytes of the longest end of `text` that is a beginning of `needle` (shorter
/// than `needle`; any length).
fn longest_prefix_suffix_any(text: &str, needle: &str) -> usize {
    needle
        .char_indices()
        .map(|(i, _)| i)
        .skip(1)
        .filter(|&end| text.ends_with(&needle[..end]))
        .max()
        .unwrap_or(0)
}

/// `text` with the JSON `\uXXXX` escapes of characters other than `"`, `\\` and control
/// characters written as the characters (surrogate pairs included), and `\/` as `/`: the form
/// in which a secret that a server escaped can be recognised. A text with no such escape is
/// returned as it is.
pub fn unescape_json_text(text: &str) -> Cow<'_, str> {
    if !text.contains("\\u") && !text.contains("\\/") {
        return Cow::Borrowed(text);
    }
    let hex4 = |s: &str| -> Option<u32> {
        let h = s.get(..4)?;
        h.bytes()
            .all(|b| b.is_ascii_hexdigit())
            .then(|| u32::from_str_radix(h, 16).ok())?
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('/') {
            out.push('/');
            rest = tail;
            continue;
        }
        if let Some(tail) = after.strip_prefix('\\') {
            // An escaped backslash stays as it is (it is not the start of an escape).
            out.push_str("\\\\");
            rest = tail;
            continue;
        }
        let Some(code) = after.strip_prefix('u').and_then(hex4) else {
            out.push('\\');
            rest = after;
            continue;
        };
        let mut used = 5;
        let mut c = char::from_u32(code);
        if (0xD800..0xDC00).contains(&code)
            && let Some(low) = after[5..].strip_prefix("\\u").and_then(hex4)
            && (0xDC00..0xE000).contains(&low)
        {
            c = char::from_u32(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00));
            used = 11;
        }
        match c {
            Some(c) if c != '"' && c != '\\' && !c.is_control() => {
                out.push(c);
                rest = &after[used..];
            }
            _ => {
                out.push('\\');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Replaces secrets in every string of a JSON value, object keys included: the value as
/// decoded, so that a secret a server wrote with `\u` escapes is found.
pub fn redact_json_value(redactor: &Redactor, value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            let r = redactor.redact(s);
            if r != *s {
                *s = r;
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| redact_json_value(redactor, v)),
        Value::Object(map) => {
            let old = std::mem::take(map);
            for (k, mut v) in old {
                redact_json_value(redactor, &mut v);
                map.insert(redactor.redact(&k), v);
            }
        }
        _ => {}
    }
}

/// The length in bytes of the longest beginning of `needle`, at least [`MIN_SECRET_CHARS`]
/// characters long, that `text` ends with.
fn longest_prefix_suffix(text: &str, needle: &str) -> Option<usize> {
    needle
        .char_indices()
        .map(|(i, c)| i + c.len_utf8())
        .skip(MIN_SECRET_CHARS - 1)
        .filter(|&end| text.ends_with(&needle[..end]))
        .max()
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || haystack.len() < from + needle.len() {
        return None;
    }
    haystack[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Percent-encodes everything but the unreserved characters of RFC 3986.
fn percent_encode(s: &str, upper: bool) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

fn is_secret_param(name: &str) -> bool {
    SECRET_PARAMS.iter().any(|p| p.eq_ignore_ascii_case(name))
}

/// Whether `c` ends a URL written in running text.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`' | '\\' | '(' | ')' | ',')
}

/// `text` with the credentials of every URL in it replaced by [`REDACTED`]: the user
/// information (`scheme://user:password@host`) and the values of query parameters that carry
/// keys (`?key=…`, `&access_token=…`).
pub fn redact_url_credentials(text: &str) -> String {
    if !text.contains("://") {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = at + 3;
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let end = tail.find(ends_url).unwrap_or(tail.len());
        out.push_str(&redact_one_url(&tail[..end]));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// One URL after its `scheme://`, credentials replaced.
fn redact_one_url(url: &str) -> String {
    let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
    let (authority, after) = url.split_at(authority_end);
    let mut out = String::with_capacity(url.len());
    match authority.rfind('@') {
        Some(at) => {
            out.push_str(REDACTED);
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let Some(q) = after.find('?') else {
        out.push_str(after);
        return out;
    };
    out.push_str(&after[..=q]);
    let query = &after[q + 1..];
    let (query, fragment) = match query.find('#') {
        Some(h) => query.split_at(h),
        None => (query, ""),
    };
    for (i, pair) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((name, value)) if is_secret_param(name) && !value.is_empty() => {
                out.push_str(name);
                out.push('=');
                out.push_str(REDACTED);
            }
            _ => out.push_str(pair),
        }
    }
    out.push_str(fragment);
    out
}

/// Environment variables that are secret whatever they hold, though their names do not follow
/// the patterns of [`is_secret_env_name`]: providers' and stores' variables (base URLs and
/// store locations may carry a key or a password in forms other than a URL's).
const KNOWN_SECRET_VARS: &[&str] = &[
    "OPENAI_BASE_URL",
    "ANTHROPIC_BASE_URL",
    "GEMINI_BASE_URL",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_OPENAI_ENDPOINT",
    "DATABASE_URL",
    "TOOLLOOP_STORE",
    "TOOLLOOP_TEST_POSTGRES",
    "OPENAI_ORGANIZATION",
    "OPENAI_ORG_ID",
];

/// Names the program marked secret ([`mark_secret_env_name`]), in upper case.
static MARKED_SECRET_NAMES: std::sync::RwLock<Vec<String>> = std::sync::RwLock::new(Vec::new());

/// Marks the variable `name` secret for the rest of the process, whatever it is called: the
/// variable a key is read from (the command's `--api-key-env`). [`is_secret_env_name`] is true
/// for it from then on, so no child process started afterwards gets it.
pub fn mark_secret_env_name(name: &str) {
    let name = name.trim().to_ascii_uppercase();
    if name.is_empty() {
        return;
    }
    let mut marked = MARKED_SECRET_NAMES
        .write()
        .unwrap_or_else(|p| p.into_inner());
    if !marked.contains(&name) {
        marked.push(name);
    }
}

/// Whether the name of an environment variable says it may hold a credential: names (in any
/// case) containing `KEY`, `TOKEN`, `SECRET`, `PASSWORD`, `PASSWD`, `CREDENTIAL` or `COOKIE`,
/// or ending in `AUTH`; the providers' and stores' own variables (`OPENAI_BASE_URL`,
/// `TOOLLOOP_STORE`, `DATABASE_URL`, …); and the names marked with [`mark_secret_env_name`].
pub fn is_secret_env_name(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "COOKIE",
    ]
    .iter()
    .any(|m| n.contains(m))
        || n.ends_with("AUTH")
        || KNOWN_SECRET_VARS.contains(&n.as_str())
        || MARKED_SECRET_NAMES
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&n)
}

/// Whether an environment variable may hold a credential: its name says so
/// ([`is_secret_env_name`]), or its value holds a URL with credentials (a user and password,
/// `https_proxy=http://user:password@proxy:3128`, or a key in its query, `?key=…`,
/// `?password=…`; see [`redact_url_credentials`]).
///
/// This is the one rule by which the toolloop command keeps variables from every child process
/// it starts (`run_command`, MCP servers: [`child_env`]) and takes them out of its own
/// environment at start.
pub fn is_secret_env(name: &str, value: &str) -> bool {
    is_secret_env_name(name) || (value.contains("://") && redact_url_credentials(value) != value)
}

/// [`is_secret_env`] for a variable as the operating system gives it (not necessarily UTF-8).
pub fn is_secret_env_os(name: &std::ffi::OsStr, value: &std::ffi::OsStr) -> bool {
    is_secret_env(&name.to_string_lossy(), &value.to_string_lossy())
}

/// The environment a child process gets: this process's variables without those that
/// [`is_secret_env`] finds secret.
pub fn child_env() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    std::env::vars_os()
        .filter(|(k, v)| !is_secret_env_os(k, v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-proj/ABC+def=123";

    #[test]
    fn every_form_of_a_secret_is_replaced() {
        let r = Redactor::new().with_secret(KEY);
        for (text, want) in [
            (format!("bad key {KEY}!"), "bad key [redacted]!"),
            (
                "bad key sk-proj%2FABC%2Bdef%3D123".to_string(),
                "bad key [redacted]",
            ),
            (
                "bad key sk-proj%2fABC%2bdef%3d123".to_string(),
                "bad key [redacted]",
            ),
            (
                r#"{"key":"sk-proj\/ABC+def=123"}"#.to_string(),
                r#"{"key":"[redacted]"}"#,
            ),
            (format!("{KEY}{KEY}"), "[redacted][redacted]"),
        ] {
            assert_eq!(r.redact(&text), want, "{text}");
        }
        assert_eq!(
            r.redact_bytes(format!("x{KEY}y").as_bytes()).as_ref(),
            b"x[redacted]y"
        );
        assert!(matches!(r.redact_bytes(b"nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_secret_cut_short_is_replaced_too() {
        let r = Redactor::new().with_secret("sk-abcdefghijklmnop");
        assert_eq!(r.redact("key sk-abcdefg…"), "key [redacted]…");
        // Fewer than MIN_SECRET_CHARS characters of it: nothing to hide.
        assert_eq!(r.redact("key sk-…"), "key sk-…");
        assert_eq!(r.redact("plain…"), "plain…");
    }

    #[test]
    fn short_secrets_are_not_looked_for() {
        let r = Redactor::new().with_secret(" abc ");
        assert!(r.is_empty());
        assert_eq!(r.redact("abc"), "abc");
    }

    #[test]
    fn credentials_in_urls_are_replaced() {
        for (text, want) in [
            (
                "at https://u:p@host:8/v1/x?key=AIza&alt=sse#f now",
                "at https://[redacted]@host:8/v1/x?key=[redacted]&alt=sse#f now",
            ),
            (
                "(http://host/p?Access_Token=t1&token=)",
                "(http://host/p?Access_Token=[redacted]&token=)",
            ),
            ("no url: user@host", "no url: user@host"),
            ("http://host/a@b", "http://host/a@b"),
        ] {
            assert_eq!(redact_url_credentials(text), want, "{text}");
        }
    }

    #[test]
    fn errors_are_redacted_everywhere_and_debug_hides_the_secrets() {
        let r = Redactor::new().with_secret(KEY);
        let e = r.redact_error(ModelError::Api(ApiError {
            status: 401,
            error_type: Some(format!("bad {KEY}")),
            code: Some(KEY.into()),
            message: format!("key {KEY}"),
            retryable: false,
            retry_after: None,
        }));
        assert!(!e.to_string().contains(KEY), "{e}");
        let ModelError::Api(a) = e else { panic!() };
        assert_eq!(a.code.as_deref(), Some(REDACTED));
        let e = r.redact_error(ModelError::Transport {
            message: KEY.into(),
            retryable: true,
        });
        assert!(e.is_retryable() && !e.to_string().contains(KEY));
        let mut overflow = crate::context::ContextOverflow::new(
            400,
            Some(KEY.into()),
            format!("prompt of {KEY} is too long"),
        );
        overflow.limit = Some(10);
        let e = r.redact_error(ModelError::ContextOverflow(overflow));
        assert!(!e.to_string().contains(KEY) && !e.is_retryable(), "{e}");
        let ModelError::ContextOverflow(o) = e else {
            panic!()
        };
        assert_eq!((o.code.as_deref(), o.limit), (Some(REDACTED), Some(10)));
        assert!(!format!("{r:?}").contains("ABC"));
    }

    #[cfg(feature = "http")]
    #[test]
    fn the_secrets_of_a_request_come_from_its_headers_and_url() {
        use reqwest::header::{HeaderMap, HeaderValue};
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer tok-12345"),
        );
        let mut v = HeaderValue::from_static("custom-secret");
        v.set_sensitive(true);
        h.insert("x-custom", v);
        h.insert("x-plain", HeaderValue::from_static("visible-value"));
        let r = Redactor::for_request("https://u:pass-word@h/v1?key=qk-9876", &h);
        let text = "tok-12345 custom-secret visible-value pass-word qk-9876";
        assert_eq!(
            r.redact(text),
            "[redacted] [redacted] visible-value [redacted] [redacted]"
        );
    }

    #[test]
    fn secret_environment_names_are_recognized() {
        for k in [
            "OPENAI_API_KEY",
            "anthropic_api_key",
            "GITHUB_TOKEN",
            "MY_SECRET_THING",
            "PGPASSWORD",
            "TOOLLOOP_STORE",
            "OPENAI_BASE_URL",
            "AWS_SECRET_ACCESS_KEY",
            "NPM_CONFIG_AUTH",
            "SESSION_COOKIE",
            "X_KEY_FILE",
            "APIKEY",
            "KEYMAP",
            "GH_AUTH",
            "MYTOKEN2",
        ] {
            assert!(is_secret_env_name(k), "{k}");
        }
        for k in [
            "PATH",
            "HOME",
            "LANG",
            "CARGO_HOME",
            "TERM",
            "GIT_AUTHOR_NAME",
            "AUTHOR",
            "https_proxy",
        ] {
            assert!(!is_secret_env_name(k), "{k}");
        }
    }

    #[test]
    fn the_one_rule_covers_names_marked_and_urls_with_credentials() {
        assert!(!is_secret_env("TOOLLOOP_REDACT_TEST_LLM", "abc"));
        mark_secret_env_name("toolloop_redact_test_llm");
        assert!(is_secret_env("TOOLLOOP_REDACT_TEST_LLM", "abc"));
        for (name, value) in [
            ("https_proxy", "http://user:pass@proxy:3128"),
            ("ALL_PROXY", "socks5://u:p@h"),
            ("MIRROR", "see https://h/x?access_token=t"),
            ("PGURL", "postgres://db/x?password=p"),
        ] {
            assert!(is_secret_env(name, value), "{name}={value}");
        }
        for (name, value) in [
            ("https_proxy", "http://proxy:3128"),
            ("HOME", "/root"),
            ("URL", "https://example.com/a?b=c"),
        ] {
            assert!(!is_secret_env(name, value), "{name}={value}");
        }
    }
}
