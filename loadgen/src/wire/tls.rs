//! TLS for every HTTP call loadgen makes (`https://` URLs): rustls with the webpki roots,
//! plus `--ca-cert FILE` (curl's `--cacert`), or no verification with `--insecure` (curl's
//! `-k`). HTTP/1.1 only: a connection's receive stamps must belong to one request, which
//! HTTP/2's shared streams would break. A certificate problem is found by one handshake
//! before the run ([`preflight`]) and said once, with its fix.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

/// A client configuration with the options it came from (to explain its refusals).
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub options: TlsOptions,
    pub config: Arc<ClientConfig>,
}

impl TlsSettings {
    pub fn new(options: &TlsOptions) -> Result<TlsSettings> {
        Ok(TlsSettings {
            options: options.clone(),
            config: options.client_config()?,
        })
    }
}

/// How loadgen checks the servers it talks to over TLS (`--ca-cert`, `--insecure`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM file of a CA certificate (or several) to trust besides the webpki roots.
    pub ca_cert: Option<PathBuf>,
    /// No verification of the server's certificate.
    pub insecure: bool,
}

/// The crypto provider every TLS config uses (ring).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsOptions {
    /// The client configuration: HTTP/1.1 (ALPN), the webpki roots and `--ca-cert`, or no
    /// verification with `--insecure`.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>> {
        if self.insecure {
            let mut config = client_builder()?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate))
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        } else {
            let mut roots = RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            if let Some(path) = &self.ca_cert {
                let certs = read_certs(path, "--ca-cert")?;
                for cert in certs {
                    roots.add(cert).with_context(|| {
                        format!("--ca-cert {}: not a usable CA certificate", path.display())
                    })?;
                }
            }
            client_trusting(roots)
        }
    }

    /// What a failed handshake with `host` means, and what to do about it.
    pub fn explain(&self, host: &str, error: &std::io::Error) -> String {
        let cert = match &self.ca_cert {
            Some(path) => format!(
                " (trusted: the webpki roots and --ca-cert {})",
                path.display()
            ),
            None => " (trusted: the webpki roots)".to_string(),
        };
        let inner = error
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>());
        let fix = match inner {
            Some(rustls::Error::InvalidCertificate(c)) => match c {
                rustls::CertificateError::UnknownIssuer
                | rustls::CertificateError::BadSignature => format!(
                    "its certificate is signed by an issuer loadgen does not trust{cert}: give \
                     the CA's certificate with --ca-cert FILE, or --insecure for a test server"
                ),
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. } => format!(
                    "its certificate is not valid for the host name `{host}`: use a host name the \
                     certificate names in --url, or --insecure for a test server"
                ),
                rustls::CertificateError::Expired
                | rustls::CertificateError::ExpiredContext { .. } => {
                    "its certificate has expired: renew it, or --insecure for a test server"
                        .to_string()
                }
                rustls::CertificateError::NotValidYet
                | rustls::CertificateError::NotValidYetContext { .. } => {
                    "its certificate is not valid yet (is this machine's clock right?)".to_string()
                }
                other => format!("its certificate was refused ({other:?}){cert}"),
            },
            _ => format!("the TLS handshake failed: {error}"),
        };
        format!("https://{host}: {fix}")
    }
}

/// The certificates of a PEM file.
fn read_certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("{flag} {}: cannot read it", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{flag} {}: not a PEM certificate file", path.display()))?;
    if certs.is_empty() {
        bail!("{flag} {}: no certificate in it", path.display());
    }
    Ok(certs)
}

/// A client configuration builder with our provider and its safe protocol versions.
fn client_builder() -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>> {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS: the crypto provider supports no protocol version")
}

/// An HTTP/1.1 client configuration that trusts `roots`.
fn client_trusting(roots: RootCertStore) -> Result<Arc<ClientConfig>> {
    let mut config = client_builder()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// An HTTP/1.1 server configuration serving `chain` with `key`.
fn server_serving(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS: the crypto provider supports no protocol version")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("TLS: the key does not match the certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A server configuration (HTTP/1.1) from PEM files of a certificate chain and its key
/// (`--tls-cert` / `--tls-key` of the mock).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>> {
    let chain = read_certs(cert, "--tls-cert")?;
    let key_der = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--tls-key {}: not a PEM private key", key.display()))?;
    server_serving(chain, key_der).with_context(|| {
        format!(
            "--tls-cert {} / --tls-key {}",
            cert.display(),
            key.display()
        )
    })
}

/// The name to check a server's certificate against.
pub fn server_name(host: &str) -> Result<ServerName<'static>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .with_context(|| format!("`{host}` is not a host name or address TLS can check"))
}

/// `--insecure`: every certificate passes, its signatures still checked for well-formedness.
#[derive(Debug)]
struct AcceptAnyCertificate;

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
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
            &provider().signature_verification_algorithms,
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
            &provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A reqwest client for loadgen's other calls (the `/metrics` scraper, the server's
/// identity, health checks) with the same TLS settings as the measured requests.
pub fn reqwest_client(
    tls: Option<&TlsSettings>,
    timeout: std::time::Duration,
) -> reqwest::Result<reqwest::Client> {
    let builder = reqwest::Client::builder().timeout(timeout);
    match tls {
        Some(tls) => builder.use_preconfigured_tls((*tls.config).clone()),
        None => builder,
    }
    .build()
}

/// A TLS pair for a server on this machine: the server's configuration and a client's
/// settings that trust it.
#[derive(Debug)]
pub struct LocalPair {
    pub server: Arc<ServerConfig>,
    pub client: TlsSettings,
}

/// A self-signed certificate for `localhost` and 127.0.0.1, made now, and a client that
/// trusts it as its only root (`loadgen calibrate --tls`).
pub fn self_signed_pair() -> Result<LocalPair> {
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .context("making a self-signed certificate")?;
    let der = cert.cert.der().clone();
    let key = PrivateKeyDer::try_from(cert.key_pair.serialize_der())
        .map_err(|e| anyhow::anyhow!("the self-signed key: {e}"))?;
    let server = server_serving(vec![der.clone()], key).context("the self-signed pair")?;
    let mut roots = RootCertStore::empty();
    roots
        .add(der)
        .context("trusting the self-signed certificate")?;
    Ok(LocalPair {
        server,
        client: TlsSettings {
            options: TlsOptions::default(),
            config: client_trusting(roots)?,
        },
    })
}

/// A pair from the server's own PEM files; the client skips verification (it only measures
/// its own timing against that server).
pub fn files_pair(cert: &Path, key: &Path) -> Result<LocalPair> {
    let options = TlsOptions {
        ca_cert: None,
        insecure: true,
    };
    Ok(LocalPair {
        server: server_config(cert, key)?,
        client: TlsSettings::new(&options)?,
    })
}
