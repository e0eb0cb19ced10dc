//! TLS for client connections (rustls with the ring provider): loads the certificate
//! chain and key once, when the server binds.
//!
//! Owns only the acceptor's configuration; the handshake happens on each connection's
//! task (with a time limit, so a client that never finishes it does not hold a slot).

use std::io;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// Builds the acceptor from PEM files; a clear error when they are missing or bad.
pub fn acceptor(files: &TlsFiles) -> io::Result<TlsAcceptor> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert_chain)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| {
            invalid(format!(
                "TLS certificate {}: {e}",
                files.cert_chain.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(invalid(format!(
            "TLS certificate {}: no certificate in the file",
            files.cert_chain.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&files.private_key)
        .map_err(|e| invalid(format!("TLS key {}: {e}", files.private_key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| invalid(format!("TLS certificate and key do not fit: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A client configuration trusting the certificates in the PEM file `ca` (how a primary
/// dials its backups when the servers speak TLS).
pub fn client_config(ca: &std::path::Path) -> io::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| invalid(format!("TLS CA certificate {}: {e}", ca.display())))?;
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| invalid(format!("TLS CA certificate {}: {e}", ca.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
