//! Connections between servers: TCP, or TLS over it when the servers have certificates,
//! and frames read and written on them asynchronously.
//!
//! Owns: dialing (the primary), accepting (the backup), TLS handshakes, and frame I/O
//! with the length limit enforced before anything is allocated. Does not own: what is
//! said (`frame`), who says it (`primary`, `backup`).
//!
//! Thread-safety: a connection is split into a read half and a write half, each owned by
//! one task.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::frame::{self, Frame, HEADER_BYTES, MAX_PAYLOAD_BYTES};

/// A connection, plain or TLS.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

pub type BoxStream = Box<dyn Stream>;

/// How a primary reaches its backups: plain TCP, or TLS trusting the given roots.
#[derive(Clone)]
pub enum Dialer {
    Tcp,
    Tls(Arc<rustls::ClientConfig>),
}

/// How a backup takes connections: plain TCP, or TLS with its certificate.
#[derive(Clone)]
pub enum Acceptor {
    Tcp,
    Tls(tokio_rustls::TlsAcceptor),
}

/// Time a connection's set-up may take (connect, TLS, first frames).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Dialer {
    pub async fn dial(&self, addr: &str) -> io::Result<BoxStream> {
        let tcp = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr}"))
            })??;
        tcp.set_nodelay(true)?;
        match self {
            Dialer::Tcp => Ok(Box::new(tcp)),
            Dialer::Tls(config) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let name = rustls::pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp))
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake"))??;
                Ok(Box::new(tls))
            }
        }
    }
}

impl Acceptor {
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<BoxStream> {
        tcp.set_nodelay(true)?;
        match self {
            Acceptor::Tcp => Ok(Box::new(tcp)),
            Acceptor::Tls(acceptor) => {
                let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake"))??;
                Ok(Box::new(tls))
            }
        }
    }
}

/// Reads one frame; `Ok(None)` at a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin + ?Sized>(
    input: &mut R,
    scratch: &mut Vec<u8>,
) -> io::Result<Option<Frame>> {
    let mut header = [0u8; HEADER_BYTES];
    match input.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    if len > MAX_PAYLOAD_BYTES {
        return Err(frame::FrameError(format!("a frame of {len} bytes is over the limit")).into());
    }
    let kind = header[4];
    let crc = u32::from_le_bytes(header[5..9].try_into().expect("4 bytes"));
    scratch.resize(len, 0);
    input.read_exact(scratch).await?;
    Ok(Some(frame::decode(kind, crc, scratch)?))
}

/// Writes one frame.
pub async fn write_frame<W: AsyncWrite + Unpin + ?Sized>(
    out: &mut W,
    frame: &Frame,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    scratch.clear();
    frame::encode(frame, scratch);
    out.write_all(scratch).await?;
    Ok(())
}
