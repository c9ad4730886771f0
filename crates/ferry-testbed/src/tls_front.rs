//! A TLS-terminating proxy on loopback in front of a plain-HTTP server (moto), its
//! certificate signed by a private CA made for it: an S3 endpoint that only a client told to
//! trust that CA can reach.
//!
//! The proxy runs on a thread and runtime of its own, so it serves whichever runtime (or none)
//! its client uses; dropping the [`TlsFront`] stops it and aborts every connection it carries.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// Connections carried at once; further clients wait to be accepted.
const MAX_CONNECTIONS: usize = 64;
/// Limit for a client's TLS handshake and for connecting to the upstream.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long stopping may wait for the proxy's tasks to go.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A running TLS front: `https://127.0.0.1:PORT`, forwarding each connection's plaintext to
/// the upstream. Stops when dropped.
#[derive(Debug)]
pub struct TlsFront {
    url: String,
    ca_pem: String,
    upstream: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsFront {
    /// Starts a front on a free loopback port for `upstream`, a plain-HTTP endpoint on
    /// loopback (`http://127.0.0.1:PORT`, as [`crate::S3Server::endpoint`] gives), with a
    /// server certificate for `127.0.0.1` and `localhost` signed by a CA generated now.
    ///
    /// # Errors
    /// `upstream` is not a loopback `http://IP:PORT`, the certificates cannot be made, or no
    /// port can be bound.
    pub fn start(upstream: &str) -> anyhow::Result<Self> {
        let upstream = upstream_addr(upstream)?;
        let (ca_pem, tls) = certificates()?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("binding the TLS front's port")?;
        listener.set_nonblocking(true).context("making the TLS front's socket non-blocking")?;
        let addr = listener.local_addr().context("the TLS front's address")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the TLS front's runtime")?;
        let (stop, stopped) = oneshot::channel();
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let thread = std::thread::Builder::new()
            .name(format!("ferry-tls-front-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::warn!("TLS front on {addr}: {e}");
                            return;
                        }
                    };
                    tokio::select! {
                        () = serve(listener, acceptor, upstream) => {}
                        _ = stopped => {}
                    }
                });
                runtime.shutdown_timeout(STOP_TIMEOUT);
            })
            .context("starting the TLS front's thread")?;
        Ok(Self {
            url: format!("https://{addr}"),
            ca_pem,
            upstream,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The front's URL, `https://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PEM certificate of the CA that signed the front's certificate: what a client must
    /// trust to reach it.
    #[must_use]
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The plain-HTTP server behind the front.
    #[must_use]
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            eprintln!("the TLS front on {} panicked", self.url);
        }
    }
}

/// The socket address of `upstream`, which must be on loopback.
fn upstream_addr(upstream: &str) -> anyhow::Result<SocketAddr> {
    let hostport = upstream.strip_prefix("http://").unwrap_or(upstream).trim_end_matches('/');
    let addr: SocketAddr =
        hostport.parse().with_context(|| format!("upstream {upstream:?} is not http://IP:PORT"))?;
    anyhow::ensure!(addr.ip().is_loopback(), "upstream {upstream} is not on loopback");
    Ok(addr)
}

/// A fresh CA's PEM certificate, and a server configuration whose certificate (for
/// `127.0.0.1` and `localhost`) that CA signed.
fn certificates() -> anyhow::Result<(String, rustls::ServerConfig)> {
    // A name of its own: a client given another front's CA must find no issuer by name.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("Ferry test CA {}-{n}", std::process::id()));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).context("signing the CA")?;

    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .context("server certificate names")?;
    params.distinguished_name.push(DnType::CommonName, "ferry-tls-front");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().context("generating the server key")?;
    let cert = params.signed_by(&key, &ca).context("signing the server certificate")?;

    let chain = vec![cert.der().clone(), CertificateDer::clone(ca.der())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the server certificate and key")?;
    // The upstream speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((ca.pem(), config))
}

/// Accepts connections until dropped; dropping it aborts every connection it carries.
async fn serve(listener: TcpListener, acceptor: TlsAcceptor, upstream: SocketAddr) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        // Reap finished connections so the set stays small.
        while connections.try_join_next().is_some() {}
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!("TLS front: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        connections.spawn(async move {
            if let Err(e) = forward(client, &acceptor, upstream).await {
                tracing::debug!("TLS front: connection from {peer}: {e:#}");
            }
            drop(slot);
        });
    }
}

/// Terminates TLS on `client` and relays its plaintext to and from `upstream`.
async fn forward(
    client: TcpStream,
    acceptor: &TlsAcceptor,
    upstream: SocketAddr,
) -> anyhow::Result<()> {
    let mut tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(client))
        .await
        .map_err(|_| anyhow!("TLS handshake took over {HANDSHAKE_TIMEOUT:?}"))?
        .context("TLS handshake")?;
    let mut server = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(upstream))
        .await
        .map_err(|_| anyhow!("connecting to {upstream} took over {HANDSHAKE_TIMEOUT:?}"))?
        .with_context(|| format!("connecting to {upstream}"))?;
    tokio::io::copy_bidirectional(&mut tls, &mut server).await.context("relaying")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_must_be_loopback_addresses() {
        assert_eq!(
            upstream_addr("http://127.0.0.1:9000/").expect("loopback"),
            SocketAddr::from((Ipv4Addr::LOCALHOST, 9000))
        );
        assert!(upstream_addr("http://10.0.0.1:9000").is_err());
        assert!(upstream_addr("http://localhost:9000").is_err());
    }

    #[test]
    fn the_ca_is_a_pem_certificate() {
        let (pem, config) = certificates().expect("certificates");
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
