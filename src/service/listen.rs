//! The client listener: accepts connections and runs each one's [`Edge`] in
//! a task of its own.
//!
//! Pingora's listening service does the same, but the task it spawns per
//! connection keeps room for a TLS handshake, held inline, for as long as
//! the connection lives, TLS or not: 8.6 KiB of every open stream and every
//! idle keep-alive connection. This task holds the connection's future only.
//! The socket is taken from, or registered in, pingora's table of listening
//! sockets, so a binary upgrade (`--upgrade`) hands it over as before.
//!
//! A connection is our [`Socket`], not pingora's stream. Pingora sizes a
//! connection's write buffer only in its own listener, so one is added
//! ([`WriteBuffer`]): a response's head and its body, or its first events,
//! then leave in one write. Reads are not buffered (pingora's 64 KiB read
//! buffer is there for TLS records): a request's head is read straight into
//! the buffer `Edge` parses.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::Service;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Handle;
use tracing::{debug, error, info};

use super::write_buffer::{self, BufferControl, WriteBuffer};
use super::Edge;
use crate::socket::Socket;

/// The kernel's queue of connections not yet accepted, as pingora sets it.
const BACKLOG: u32 = 65535;

/// A connection's write buffer: pingora's default, one TCP segment.
const WRITE_BUFFER: usize = 1460;

pub struct Listener {
    name: String,
    addr: String,
    edge: Arc<Edge>,
}

impl Listener {
    /// Serves `edge` on `addr` (`host:port`).
    pub fn new(name: &str, addr: &str, edge: Edge) -> Self {
        Listener {
            name: name.to_owned(),
            addr: addr.to_owned(),
            edge: Arc::new(edge),
        }
    }

    /// The socket a previous process handed over for `addr`, or a new one,
    /// registered for the next upgrade.
    fn socket(&self, fds: Option<ListenFds>) -> io::Result<TcpListener> {
        let Some(fds) = fds else {
            return bind(&self.addr);
        };
        let mut table = fds.lock();
        if let Some(&fd) = table.get(&self.addr) {
            // SAFETY: pingora's table hands each listening socket it received
            // to the one service listening on that address, and we are it.
            let socket = unsafe { std::net::TcpListener::from_raw_fd(fd) };
            socket.set_nonblocking(true)?;
            return TcpListener::from_std(socket);
        }
        let listener = bind(&self.addr)?;
        table.add(self.addr.clone(), listener.as_raw_fd());
        Ok(listener)
    }
}

/// Accepts until the server shuts down, each connection in a task of its own.
async fn accept(listener: &TcpListener, edge: &Arc<Edge>, mut shutdown: ShutdownWatch) {
    let mut runtimes = Runtimes::discover();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|&down| down) => return,
        };
        let (socket, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                error!("accept() failed: {e}");
                // Out of file descriptors: accepting again at once would
                // fail the same way, in a busy loop.
                if e.raw_os_error() == Some(libc::EMFILE) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                continue;
            }
        };
        if let Err(e) = socket.set_nodelay(true) {
            // The client is most likely gone already.
            debug!("TCP_NODELAY on an accepted connection failed: {e}");
            continue;
        }
        let edge = edge.clone();
        let shutdown = shutdown.clone();
        let send_timeout = edge.send_timeout();
        // Without work stealing, each connection goes to the thread's
        // runtime serving the fewest, not all to this loop's.
        let (runtime, open) = runtimes.least_loaded();
        // The socket is registered with this runtime's I/O driver: served
        // on another, each of its wake-ups would cross threads (a futex
        // wake and a switch per read). It moves there unregistered.
        let socket = match runtime.id() == Handle::current().id() {
            true => Accepted::Registered(socket),
            false => match socket.into_std() {
                Ok(socket) => Accepted::Moved(socket),
                Err(e) => {
                    debug!("moving an accepted connection failed: {e}");
                    continue;
                }
            },
        };
        runtime.spawn(async move {
            let _open = open;
            let socket = match socket {
                Accepted::Registered(socket) => socket,
                Accepted::Moved(socket) => match TcpStream::from_std(socket) {
                    Ok(socket) => socket,
                    Err(e) => {
                        error!("registering an accepted connection failed: {e}");
                        return;
                    }
                },
            };
            let control = BufferControl::default();
            let buffered = WriteBuffer::new(WRITE_BUFFER, socket, control.clone(), send_timeout);
            let connection = Socket::new(buffered, peer);
            write_buffer::serving(control, async move {
                let mut next = edge.process_new(Box::new(connection), &shutdown).await;
                while let Some(stream) = next {
                    next = edge.process_new(stream, &shutdown).await;
                }
            })
            .await
        });
    }
}

/// The runtimes connections are served on: one per worker thread without
/// work stealing (else one), each with its count of open connections.
///
/// pingora hands out its runtimes only one at a time, at random
/// (`current_handle`), and random placement leaves threads unevenly loaded:
/// of two keep-alive clients, half the time both land on one thread while
/// the other idles. So the runtimes are learnt from those draws, and each
/// connection goes to the one with the fewest open.
struct Runtimes {
    known: Vec<(Handle, Arc<()>)>,
}

impl Runtimes {
    /// Enough draws to meet every runtime of 64 threads but for one chance in
    /// millions; a runtime still unmet is met by a later connection's draw.
    const DRAWS: usize = 1536;

    fn discover() -> Self {
        let mut runtimes = Runtimes { known: Vec::new() };
        for _ in 0..Self::DRAWS {
            runtimes.meet(pingora_runtime::current_handle());
        }
        runtimes
    }

    fn meet(&mut self, handle: Handle) {
        if !self
            .known
            .iter()
            .any(|(known, _)| known.id() == handle.id())
        {
            self.known.push((handle, Arc::new(())));
        }
    }

    /// The runtime with the fewest open connections (the first met of
    /// equals), and the token a connection holds there while it is open.
    fn least_loaded(&mut self) -> (Handle, Arc<()>) {
        self.meet(pingora_runtime::current_handle());
        self.known
            .iter()
            .min_by_key(|(_, open)| Arc::strong_count(open))
            .map(|(handle, open)| (handle.clone(), open.clone()))
            // Never empty: a runtime was just met.
            .unwrap_or_else(|| (Handle::current(), Arc::new(())))
    }
}

/// An accepted connection on its way to the runtime that serves it.
enum Accepted {
    /// With the accepting runtime's I/O driver, which serves it.
    Registered(TcpStream),
    /// For another runtime's driver.
    Moved(std::net::TcpStream),
}

/// A listening socket on `addr` (`host:port`, a name resolved once).
fn bind(addr: &str) -> io::Result<TcpListener> {
    let resolved = addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr} resolves to no address"),
        )
    })?;
    let socket = match resolved {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(resolved)?;
    socket.listen(BACKLOG)
}

#[async_trait]
impl Service for Listener {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        let listener = match self.socket(fds) {
            Ok(listener) => listener,
            Err(e) => {
                error!(addr = %self.addr, "cannot listen: {e}");
                std::process::exit(1);
            }
        };
        info!(addr = %self.addr, "listening");
        // One accept loop: pingora's `listener_tasks_per_fd` is left at 1.
        accept(&listener, &self.edge, shutdown).await;
        self.edge.close_idle();
        self.edge.cleanup().await;
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        Some(vec![self.addr.clone()])
    }
}
