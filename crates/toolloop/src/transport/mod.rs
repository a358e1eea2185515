//! The transport shared by the HTTP provider adapters: the HTTP client with its retries and
//! limits ([`http`]) and the Server-Sent Events reader ([`sse`]). What carries bytes, events and
//! errors between them and an adapter's decoder is the adapters' own
//! (`providers::adapter`).
//!
//! Nothing here knows a wire format: what a provider's bodies, events and error objects mean
//! stays in its adapter ([`crate::providers`]).

#[cfg(feature = "http")]
pub mod cassette;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
pub mod request_log;
pub mod sse;
#[cfg(feature = "http")]
pub mod tls;
pub mod wire;

/// The process's limit on open files (`RLIMIT_NOFILE`) before and after
/// [`raise_open_files_limit`].
#[cfg(unix)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFilesLimit {
    /// The soft limit before (`None`: unlimited).
    pub before: Option<u64>,
    /// The soft limit now (`None`: unlimited).
    pub now: Option<u64>,
    /// The hard limit, which only a privileged process can raise (`None`: unlimited).
    pub hard: Option<u64>,
}

/// Raises the process's soft limit on open files (`RLIMIT_NOFILE`) to its hard limit, and says
/// what it was and is.
///
/// Every HTTP/1.1 request in flight holds a connection, and every connection a file descriptor,
/// so a process that runs thousands of loops at once needs as many descriptors as it has model
/// calls in flight (besides its tools' files, its store and, when the server runs in the same
/// process, the server's side of each connection). Many systems start programs with a soft
/// limit of 1,024 and a hard limit far above it (`ulimit -Sn` and `ulimit -Hn` show both); any
/// process may raise its soft limit up to the hard one, and this does that. toolloop never does
/// it behind a program's back: the `toolloop` command calls this at start-up, and a program
/// that embeds the library calls it itself when it means to hold many loops. Raising the hard
/// limit takes the administrator (`/etc/security/limits.conf`, systemd's `LimitNOFILE=`, or a
/// container's `--ulimit nofile=`). See the README's "Many loops in one process".
///
/// Fails only when the system refuses the change; the limit is then left as it was.
#[cfg(unix)]
pub fn raise_open_files_limit() -> std::io::Result<OpenFilesLimit> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let mut result = OpenFilesLimit {
        before: limit.current,
        now: limit.current,
        hard: limit.maximum,
    };
    let higher = match (limit.current, limit.maximum) {
        (Some(soft), Some(hard)) => hard > soft,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if higher {
        // macOS refuses a soft limit above `kern.maxfilesperproc` even when the hard limit
        // is unlimited: that is an error, and the limit stays as it was.
        setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        )?;
        result.now = getrlimit(Resource::Nofile).current;
    }
    Ok(result)
}

/// Makes rustls's `ring` the process's default TLS crypto provider, unless the program has
/// installed one already (then that one is used). reqwest builds every client's TLS
/// configuration from the process's default, so this runs before any client is built:
/// [`http::HttpTransport::new`] calls it, and so should a program that builds its own
/// `reqwest::Client` beside toolloop's. Calling it again does nothing.
#[cfg(feature = "http")]
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Why a provider's base URL was refused by [`check_base_url`]. The messages show the URL
/// without any password or key it carries.
#[derive(Debug, thiserror::Error)]
pub enum BaseUrlError {
    /// The text does not parse as a URL.
    #[error("`{url}` is not a URL ({source}); {}", EXPECTED)]
    NotAUrl {
        /// The URL as given, credentials hidden.
        url: String,
        /// The parser's complaint.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The URL has no `scheme://` (`localhost:8089` reads as the scheme `localhost:`).
    #[error(
        "`{url}` has no scheme (it reads as the scheme `{scheme}:`); {} (http://{url}?)",
        EXPECTED
    )]
    NoScheme {
        /// The URL as given, credentials hidden.
        url: String,
        /// What the text reads as the scheme.
        scheme: String,
    },
    /// The scheme is neither `http` nor `https`.
    #[error(
        "`{url}` uses the scheme `{scheme}`: the providers speak HTTP; {}",
        EXPECTED
    )]
    Scheme {
        /// The URL as given, credentials hidden.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// The URL has no host.
    #[error("`{url}` has no host; {}", EXPECTED)]
    NoHost {
        /// The URL as given, credentials hidden.
        url: String,
    },
    /// The URL has a query, which would end up before the API path appended to it.
    #[error(
        "`{url}` has a query (`?…`): the API path is appended to the base URL, so the query \
         would end up before it; give the URL without it"
    )]
    Query {
        /// The URL as given, credentials hidden.
        url: String,
    },
    /// The URL has a fragment, which is never sent and would swallow the API path.
    #[error(
        "`{url}` has a fragment (`#…`): it is never sent, and the API path appended to the \
         base URL would be lost in it; give the URL without it"
    )]
    Fragment {
        /// The URL as given, credentials hidden.
        url: String,
    },
}

const EXPECTED: &str = "expected an http:// or https:// URL with a host, like \
                        https://api.example.com/v1";

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
/// let e = e.to_string();
/// assert!(!e.contains("hunter2") && !e.contains("sekrit"), "{e}");
/// ```
pub fn check_base_url(url: &str) -> Result<(), BaseUrlError> {
    let raw = url.trim();
    // What the messages show: never a password or a key the URL carries.
    let url = crate::redact::redact_url_credentials(raw);
    let parsed = match url::Url::parse(raw) {
        Ok(u) => u,
        Err(e) => {
            return Err(BaseUrlError::NotAUrl {
                url,
                source: Box::new(e),
            });
        }
    };
    match parsed.scheme() {
        "http" | "https" => {}
        scheme if !raw.contains("://") => {
            let scheme = scheme.to_string();
            return Err(BaseUrlError::NoScheme { url, scheme });
        }
        scheme => {
            let scheme = scheme.to_string();
            return Err(BaseUrlError::Scheme { url, scheme });
        }
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(BaseUrlError::NoHost { url });
    }
    if parsed.query().is_some() {
        return Err(BaseUrlError::Query { url });
    }
    if parsed.fragment().is_some() {
        return Err(BaseUrlError::Fragment { url });
    }
    Ok(())
}
