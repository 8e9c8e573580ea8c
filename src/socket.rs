//! A TCP connection as pingora's `IO` trait asks for one, for the client
//! connections we serve and the plain-HTTP upstream connections we open.
//!
//! Not pingora's own stream: it reads the clock twice around each read that
//! waits (to total the time reads wait, which nothing here reports), keeps
//! a buffered layer and a rewind buffer in front of the socket, and reads
//! through two layers of wrappers. On an upstream connection that was about
//! 700 instructions of a passthrough request (2%): the answer's read and the
//! pool's check at reuse.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

/// A connected socket `S` (a `TcpStream`, or one behind a write buffer),
/// with the peer's address known from `accept` or `connect`, without
/// another syscall.
#[derive(Debug)]
pub struct Socket<S> {
    io: S,
    digest: Arc<SocketDigest>,
    established: SystemTime,
}

impl<S: AsRawFd> Socket<S> {
    pub fn new(io: S, peer: SocketAddr) -> Self {
        let digest = SocketDigest::from_raw_fd(io.as_raw_fd());
        let _ = digest.peer_addr.set(Some(peer.into()));
        Socket {
            io,
            digest: Arc::new(digest),
            established: SystemTime::now(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Socket<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Socket<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[async_trait]
impl<S: AsyncWrite + Unpin + Send> Shutdown for Socket<S> {
    async fn shutdown(&mut self) {
        // Flushes what is buffered first.
        let _ = AsyncWriteExt::shutdown(&mut self.io).await;
    }
}

impl<S: AsRawFd> UniqueID for Socket<S> {
    fn id(&self) -> UniqueIDType {
        self.io.as_raw_fd()
    }
}

impl<S> Ssl for Socket<S> {}

impl<S> GetTimingDigest for Socket<S> {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        vec![Some(TimingDigest {
            established_ts: self.established,
            ..TimingDigest::default()
        })]
    }
}

impl<S> GetProxyDigest for Socket<S> {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        None
    }
}

impl<S> GetSocketDigest for Socket<S> {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        Some(self.digest.clone())
    }
}

#[async_trait]
impl<S: Send + Sync> Peek for Socket<S> {}
