//! The TLS configuration of toolloop's HTTP clients: rustls with the process's crypto provider
//! (see [`super::install_tls_provider`]), server certificates checked by the platform's verifier
//! against the system's roots, HTTP/2 or HTTP/1.1 by ALPN.
//!
//! The system's roots are read when the first server certificate is checked, not when a client
//! is built: reading them (every file of `/etc/ssl/certs` on Linux, or `SSL_CERT_FILE` and
//! `SSL_CERT_DIR` when set) is most of what a short command spends before its first request, and
//! a client that only ever speaks `http://` (a local model server, the mock) needs none of them.
//! They are read once per process and shared by every client built from [`client_config`]; a
//! system without roots fails each `https://` connection (saying so), never the building of a
//! client or a plain `http://` call.

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use std::sync::{Arc, OnceLock};

/// The TLS configuration for a `reqwest` client (`ClientBuilder::tls_backend_preconfigured`):
/// the process's default crypto provider (ring when none is installed; this installs it), TLS 1.2
/// and 1.3, the platform's verifier with the system's roots read on first use (shared by every
/// configuration this returns), and ALPN offering `h2` then `http/1.1`, as reqwest's own
/// default configuration does.
pub fn client_config() -> Result<rustls::ClientConfig, rustls::Error> {
    super::install_tls_provider();
    let verifier = shared_verifier();
    let mut config = rustls::ClientConfig::builder_with_provider(verifier.provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The process's one verifier (its roots are read once).
fn shared_verifier() -> Arc<LazyPlatformVerifier> {
    static SHARED: OnceLock<Arc<LazyPlatformVerifier>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let provider = CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
            Arc::new(LazyPlatformVerifier {
                provider,
                platform: OnceLock::new(),
            })
        })
        .clone()
}

/// `rustls_platform_verifier::Verifier`, made when the first certificate is checked. The
/// handshake signatures are checked with the provider's algorithms, exactly as the platform
/// verifier checks them, without its roots.
#[derive(Debug)]
struct LazyPlatformVerifier {
    provider: Arc<CryptoProvider>,
    platform: OnceLock<Result<rustls_platform_verifier::Verifier, rustls::Error>>,
}

impl LazyPlatformVerifier {
    fn platform(&self) -> Result<&rustls_platform_verifier::Verifier, rustls::Error> {
        self.platform
            .get_or_init(|| {
                rustls_platform_verifier::Verifier::new(self.provider.clone()).map_err(|e| {
                    rustls::Error::General(format!(
                        "cannot check the server's certificate: the system's root certificates \
                         could not be read ({e}); install them (ca-certificates), or name a file \
                         of them with SSL_CERT_FILE"
                    ))
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl ServerCertVerifier for LazyPlatformVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.platform()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
