//! Connections that a handler can reset: the listener wraps each accepted socket so that a
//! reset fault can break it (with an RST) before or during a response.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A TCP listener whose connections can be reset from a handler.
pub(crate) struct ResettableListener(pub TcpListener);

impl Listener for ResettableListener {
    type Io = ResettableIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // axum's own accept loop: it waits out transient errors (too many open files, …).
        let (stream, addr) = Listener::accept(&mut self.0).await;
        let _ = stream.set_nodelay(true);
        let io = ResettableIo {
            stream,
            handle: ConnHandle(Arc::new(AtomicBool::new(false))),
            lingering: false,
        };
        (io, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// The handle a handler uses to reset its connection (its `ConnectInfo`).
#[derive(Clone, Debug)]
pub(crate) struct ConnHandle(Arc<AtomicBool>);

impl ConnHandle {
    /// Resets the connection: from now on every read and write fails, and the socket is closed
    /// with an RST as soon as the server drops it.
    pub(crate) fn reset(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_reset(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl Connected<IncomingStream<'_, ResettableListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, ResettableListener>) -> Self {
        stream.io().handle.clone()
    }
}

/// An accepted socket with its reset switch.
pub(crate) struct ResettableIo {
    stream: TcpStream,
    handle: ConnHandle,
    lingering: bool,
}

impl ResettableIo {
    /// The error every operation gives once the connection is reset; the first one also sets
    /// `SO_LINGER` to zero, so that closing the socket sends an RST.
    fn check(&mut self) -> io::Result<()> {
        if !self.handle.is_reset() {
            return Ok(());
        }
        if !self.lingering {
            self.lingering = true;
            let _ = self.stream.set_zero_linger();
        }
        Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "connection reset by the mock (fault injection)",
        ))
    }
}

impl AsyncRead for ResettableIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResettableIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
