//! The streamable HTTP transport (rmcp's, on reqwest with rustls).

use std::collections::{BTreeMap, HashMap};

/// rmcp's transport for `url` with `headers` on every request. The TLS crypto provider is
/// rustls's `ring` (installed as the process default when none is).
pub(crate) fn transport(
    url: &str,
    headers: &BTreeMap<String, String>,
) -> Result<
    rmcp::transport::StreamableHttpClientTransport<
        impl rmcp::transport::streamable_http_client::StreamableHttpClient + 'static,
    >,
    String,
> {
    // reqwest builds its TLS configuration from the process's default provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut custom = HashMap::new();
    for (name, value) in headers {
        let header = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header `{name}` is not a valid header name"))?;
        let mut value = http::HeaderValue::from_str(value)
            .map_err(|_| format!("header `{name}`: the value is not a valid header value"))?;
        value.set_sensitive(true);
        custom.insert(header, value);
    }
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url)
            .custom_headers(custom);
    Ok(rmcp::transport::StreamableHttpClientTransport::from_config(
        config,
    ))
}
