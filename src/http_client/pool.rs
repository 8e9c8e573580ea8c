//! Idle HTTP/1 connections, kept for the next request to the same peer.
//!
//! pingora's connector pool, which this replaces for HTTP/1, spends a task
//! per released connection watching it (spawned, woken and joined again on
//! reuse, with a timer, a oneshot and two locks) and a `getpeername` per
//! reuse: about a tenth of a pooled request's CPU. Here a connection waits
//! in a list instead. Closed ones are found out without watching them: a
//! server's close makes the socket readable, which the runtime records, so a
//! zero-cost read attempt at reuse tells a closed connection from a live one;
//! a sweeper drops the expired and the closed every few seconds.
//!
//! Each thread keeps its own lists (`per_thread`): without work stealing a
//! connection is made for one thread's runtime anyway, and a lock that both
//! cores took at each request moved its line between them twice a request.
//! A runtime with work stealing, whose tasks move between its threads, keeps
//! one list for all of them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use tokio::io::AsyncReadExt;
use tokio::runtime::RuntimeFlavor;
use tokio::time::Instant;

use super::h1::Link;
use crate::per_thread::PerThread;

/// How long a connection may sit idle before it is closed.
pub const IDLE: Duration = Duration::from_secs(60);
/// Idle connections kept at most by a thread, over all peers: beyond it the
/// oldest closes.
const CAPACITY: usize = 1024;
/// How often the sweeper runs.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The process's idle connections, by peer (`Peer::reuse_hash`: address and
/// TLS settings, so endpoints never share one by mistake) and by runtime.
pub fn shared() -> &'static Pool {
    static SHARED: OnceLock<Pool> = OnceLock::new();
    SHARED.get_or_init(|| Pool::new(CAPACITY, IDLE))
}

pub struct Pool {
    parts: PerThread<Part>,
    /// For runtimes with work stealing.
    shared: Part,
    capacity: usize,
    expiry: Duration,
}

/// A thread's idle connections.
#[derive(Default)]
struct Part {
    idle: Mutex<Idle>,
    /// Whether a sweeper task runs: it stops with the runtime it was spawned
    /// on (each test has its own), and the next release starts another.
    sweeping: AtomicBool,
}

#[derive(Default)]
struct Idle {
    /// Per peer and runtime, oldest first: a connection is taken from the
    /// back, where the most recently used one is. The keys are ours, not a
    /// client's: a fast hash, not SipHash (a lookup per request each way).
    by_peer: HashMap<Key, VecDeque<(Instant, Link)>, foldhash::fast::RandomState>,
    count: usize,
}

impl Pool {
    fn new(capacity: usize, expiry: Duration) -> Self {
        Pool {
            parts: PerThread::new(Part::default),
            shared: Part::default(),
            capacity,
            expiry,
        }
    }

    /// The most recently released live connection to `peer`, if any.
    pub fn take(&self, peer: u64) -> Option<Link> {
        let (peer, part) = self.place(peer);
        loop {
            let (since, mut link) = {
                let mut idle = part.lock();
                // An emptied list stays for the connection's return (the
                // sweeper drops it if none comes): no removal and no new
                // list per request.
                let found = idle.by_peer.get_mut(&peer)?.pop_back()?;
                idle.count -= 1;
                found
            };
            // Expired or closed ones are dropped (closed) outside the lock.
            if since.elapsed() < self.expiry && is_quiet(&mut link.stream) {
                return Some(link);
            }
        }
    }

    /// Keeps `stream` for the next request to `peer`, unless the server
    /// already closed it or sent something unasked.
    pub fn put(&'static self, peer: u64, mut link: Link) {
        if !is_quiet(&mut link.stream) {
            return;
        }
        let (peer, part) = self.place(peer);
        let evicted = {
            let mut idle = part.lock();
            idle.by_peer
                .entry(peer)
                .or_default()
                .push_back((Instant::now(), link));
            idle.count += 1;
            (idle.count > self.capacity).then(|| idle.evict_oldest())
        };
        drop(evicted);
        self.keep_sweeping(part);
    }

    fn keep_sweeping(&'static self, part: &'static Part) {
        // Read first: a swap writes the line at every release.
        if part.sweeping.load(Ordering::Acquire) || part.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Marks the sweeper gone when its task ends, however it ends.
        struct Running(&'static AtomicBool);
        impl Drop for Running {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let running = Running(&part.sweeping);
        tokio::spawn(async move {
            let _running = running;
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                self.sweep(part);
            }
        });
    }

    /// Drops a thread's expired and closed connections, and the lists left
    /// empty.
    fn sweep(&self, part: &Part) {
        let mut gone = Vec::new();
        let mut idle = part.lock();
        let mut count = 0;
        idle.by_peer.retain(|_, list| {
            let mut kept = VecDeque::with_capacity(list.len());
            for (since, mut link) in list.drain(..) {
                if since.elapsed() < self.expiry && is_quiet(&mut link.stream) {
                    kept.push_back((since, link));
                } else {
                    gone.push(link);
                }
            }
            count += kept.len();
            *list = kept;
            !list.is_empty()
        });
        idle.count = count;
        drop(idle);
        drop(gone);
    }
}

impl Part {
    fn lock(&self) -> MutexGuard<'_, Idle> {
        // Plain data: a poisoned lock still holds usable lists.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Idle {
    /// Removes the connection released longest ago, over all peers.
    fn evict_oldest(&mut self) -> Option<Link> {
        let peer = *self
            .by_peer
            .iter()
            .filter_map(|(peer, list)| Some((peer, list.front()?.0)))
            .min_by_key(|(_, since)| *since)?
            .0;
        let list = self.by_peer.get_mut(&peer)?;
        let (_, link) = list.pop_front()?;
        if list.is_empty() {
            self.by_peer.remove(&peer);
        }
        self.count -= 1;
        Some(link)
    }
}

/// A connection's peer and the runtime it was made on: its socket is
/// registered with that runtime's I/O driver, and used from another runtime
/// (the health checks' own, or a thread's own without work stealing), every
/// wake-up of it would cross threads, costing a futex and an eventfd write
/// per read.
type Key = (u64, Option<tokio::runtime::Id>);

impl Pool {
    /// A connection's key, and the part of the pool it waits in.
    fn place(&self, peer: u64) -> (Key, &Part) {
        let runtime = tokio::runtime::Handle::try_current().ok();
        let part = match &runtime {
            Some(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => &self.shared,
            _ => self.parts.local(),
        };
        ((peer, runtime.map(|handle| handle.id())), part)
    }
}

/// Whether an idle connection has nothing to read: neither a close nor
/// bytes the server sent unasked. Costs no syscall unless the runtime saw
/// the socket become readable.
fn is_quiet(stream: &mut pingora::protocols::Stream) -> bool {
    let mut byte = [0; 1];
    // `unconstrained`: the budget could make a ready read look pending.
    tokio::task::unconstrained(stream.read(&mut byte))
        .now_or_never()
        .is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::protocols::l4::stream::Stream as TcpStream;

    /// A connected pair: our end as a pooled stream, and the server's end.
    async fn connection() -> (Link, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ours = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (theirs, _) = listener.accept().await.unwrap();
        (Link::new(Box::new(TcpStream::from(ours))), theirs)
    }

    /// Which connection: its socket (unique while open).
    fn fd(link: &Link) -> i32 {
        link.stream.id()
    }

    fn leaked(capacity: usize, expiry: Duration) -> &'static Pool {
        Box::leak(Box::new(Pool::new(capacity, expiry)))
    }

    #[tokio::test]
    async fn the_most_recently_released_connection_of_the_peer_is_taken() {
        let pool = leaked(8, IDLE);
        let (a, _server_a) = connection().await;
        let (b, _server_b) = connection().await;
        let (c, _server_c) = connection().await;
        let (a_fd, b_fd) = (fd(&a), fd(&b));
        pool.put(1, a);
        pool.put(1, b);
        pool.put(2, c);
        assert_eq!(pool.take(1).map(|s| fd(&s)), Some(b_fd));
        assert_eq!(pool.take(1).map(|s| fd(&s)), Some(a_fd));
        assert!(pool.take(1).is_none());
        assert!(pool.take(2).is_some());
        assert!(pool.take(3).is_none());
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_not_taken() {
        let pool = leaked(8, IDLE);
        let (ours, theirs) = connection().await;
        pool.put(1, ours);
        drop(theirs);
        // Lets the runtime see the close (the socket turns readable).
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(pool.take(1).is_none());
    }

    #[tokio::test]
    async fn a_connection_with_unasked_bytes_is_not_kept() {
        use tokio::io::AsyncWriteExt;
        let pool = leaked(8, IDLE);
        let (ours, mut theirs) = connection().await;
        theirs
            .write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        pool.put(1, ours);
        assert!(pool.take(1).is_none());
    }

    #[tokio::test]
    async fn beyond_capacity_the_connection_released_longest_ago_closes() {
        let pool = leaked(2, IDLE);
        let mut servers = Vec::new();
        let mut fds = Vec::new();
        for peer in [1, 2, 1] {
            let (ours, theirs) = connection().await;
            servers.push(theirs);
            fds.push(fd(&ours));
            pool.put(peer, ours);
        }
        assert_eq!(pool.parts.local().lock().count, 2);
        assert_eq!(pool.take(1).map(|s| fd(&s)), Some(fds[2]));
        assert!(
            pool.take(1).is_none(),
            "the first one, released first, is gone"
        );
        assert_eq!(pool.take(2).map(|s| fd(&s)), Some(fds[1]));
    }

    #[tokio::test]
    async fn an_expired_connection_is_neither_taken_nor_kept_by_a_sweep() {
        let pool = leaked(8, Duration::ZERO);
        let (ours, _theirs) = connection().await;
        pool.put(1, ours);
        let (ours, _theirs2) = connection().await;
        pool.put(2, ours);
        assert!(pool.take(1).is_none());
        pool.sweep(pool.parts.local());
        let idle = pool.parts.local().lock();
        assert_eq!((idle.count, idle.by_peer.len()), (0, 0));
    }

    /// A connection made on one runtime (the health checks' own, say) is
    /// not handed to a request on another: its wake-ups would cross threads.
    #[test]
    fn a_connection_is_taken_only_on_the_runtime_it_was_made_on() {
        let pool = leaked(8, IDLE);
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let (first, second) = (runtime(), runtime());
        let (ours, _theirs) = first.block_on(connection());
        let made = fd(&ours);
        first.block_on(async { pool.put(1, ours) });
        assert!(second.block_on(async { pool.take(1) }).is_none());
        let taken = first.block_on(async { pool.take(1) });
        assert_eq!(taken.as_ref().map(fd), Some(made));
    }

    /// With work stealing a task moves between the runtime's threads: what
    /// one of them released, another finds.
    #[test]
    fn with_work_stealing_a_connection_is_found_from_any_thread_of_the_runtime() {
        let pool = leaked(8, IDLE);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (ours, _theirs) = runtime.block_on(connection());
        let made = fd(&ours);
        runtime.block_on(async {
            tokio::spawn(async move { pool.put(1, ours) })
                .await
                .unwrap()
        });
        let taken = runtime.block_on(async {
            tokio::spawn(async move { pool.take(1).map(|link| fd(&link)) })
                .await
                .unwrap()
        });
        assert_eq!(taken, Some(made));
    }
}
