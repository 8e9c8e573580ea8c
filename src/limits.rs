//! Open event streams per client, so one client cannot hold every
//! connection the proxy and its upstreams have; and open client connections,
//! so idle ones cannot use up the process's file descriptors.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::Notify;

/// Who a request counts against: the configured API key it matched (hashed,
/// never kept as is), or its address when the proxy has no keys.
pub fn client_key(authorization: Option<&[u8]>, address: Option<String>) -> u64 {
    let mut hasher = DefaultHasher::new();
    match authorization {
        Some(key) => key.hash(&mut hasher),
        None => address.hash(&mut hasher),
    }
    hasher.finish()
}

fn open_streams() -> &'static Mutex<HashMap<u64, usize>> {
    static OPEN: OnceLock<Mutex<HashMap<u64, usize>>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
}

/// One open stream of one client; released when dropped.
pub struct StreamSlot(u64);

impl StreamSlot {
    /// A slot, unless `client` already holds `max` (0: no limit).
    pub fn acquire(client: u64, max: usize) -> Option<StreamSlot> {
        let mut open = open_streams().lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(client).or_insert(0);
        if max > 0 && *count >= max {
            return None;
        }
        *count += 1;
        Some(StreamSlot(client))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = open_streams().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.0) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.0);
            }
        }
    }
}

/// Open client connections, capped. At the cap, the connection idle the
/// longest (waiting for its next request) is closed to make room, as nginx
/// reuses its oldest keep-alive connections; with none idle, the new
/// connection is refused.
///
/// A connection is registered once, as it opens; between requests it only
/// marks itself idle and busy in its own slot, without the registry's lock.
/// Finding the oldest idle one, which only a connection beyond the cap has
/// to, reads every slot; so does a shutdown, which wakes each.
#[derive(Default)]
pub struct Connections {
    registry: Mutex<Registry>,
    /// Set once the server is shutting down.
    closing: AtomicBool,
}

#[derive(Default)]
struct Registry {
    open: HashMap<u64, Arc<Slot>>,
    next: u64,
}

#[derive(Default)]
struct Slot {
    /// When the idle wait the connection is in began (nanoseconds from the
    /// process's first idle wait, plus one: never 0), or 0 while it serves
    /// a request or once it was chosen to be shed. A clock, not a shared
    /// count: a count that every request on both cores raised moved its
    /// line between them.
    idle_since: AtomicU64,
    shed: Notify,
}

/// One open connection; counted until dropped.
pub struct Connection<'a> {
    connections: &'a Connections,
    id: u64,
    slot: Arc<Slot>,
}

/// A connection waiting for its next request, sheddable until dropped.
pub struct Idle<'a> {
    slot: &'a Slot,
}

impl Connections {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new connection, unless `max` are open (0: no limit) and none
    /// of them is idle to close instead.
    pub fn admit(&self, max: usize) -> Option<Connection<'_>> {
        let mut registry = self.registry();
        if max > 0 && registry.open.len() >= max {
            // Two waits may begin at one tick of a coarse clock: the
            // connection opened first goes first.
            let oldest = registry
                .open
                .iter()
                .filter_map(|(id, slot)| {
                    let since = slot.idle_since.load(Ordering::Acquire);
                    (since != 0).then_some(((since, *id), slot))
                })
                .min_by_key(|(order, _)| *order)?
                .1;
            // Not chosen twice; a request arriving meanwhile keeps the
            // choice for the connection's next idle wait.
            oldest.idle_since.store(0, Ordering::Release);
            oldest.shed.notify_one();
        }
        let id = registry.next;
        registry.next += 1;
        let slot = Arc::new(Slot::default());
        registry.open.insert(id, slot.clone());
        Some(Connection {
            connections: self,
            id,
            slot,
        })
    }

    /// The server is shutting down: every idle wait ends, now or as it
    /// begins ([`Connection::closing`], or the permit each slot keeps).
    pub fn close_idle(&self) {
        self.closing.store(true, Ordering::SeqCst);
        for slot in self.registry().open.values() {
            slot.shed.notify_one();
        }
    }
}

impl Connection<'_> {
    /// Whether the server is shutting down: the connection closes rather
    /// than wait for another request.
    pub fn closing(&self) -> bool {
        self.connections.closing.load(Ordering::SeqCst)
    }

    /// Marks the connection idle until the returned guard is dropped.
    pub fn idle(&self) -> Idle<'_> {
        static FIRST: LazyLock<Instant> = LazyLock::new(Instant::now);
        let since = Instant::now().saturating_duration_since(*FIRST).as_nanos() as u64 + 1;
        self.slot.idle_since.store(since, Ordering::Release);
        Idle { slot: &self.slot }
    }
}

impl Idle<'_> {
    /// Resolves when the connection was chosen to make room for another, or
    /// the server began shutting down since it was admitted (one admitted
    /// later is not woken: [`Connection::closing`] tells it). A choice made
    /// just as a request arrived is kept for the next idle wait.
    pub async fn shed(&self) {
        self.slot.shed.notified().await;
    }
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        self.slot.idle_since.store(0, Ordering::Release);
    }
}

impl Drop for Connection<'_> {
    fn drop(&mut self) {
        self.connections.registry().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn slots_are_counted_per_client_and_released() {
        let alice = client_key(Some(b"Bearer a"), None);
        let bob = client_key(Some(b"Bearer b"), None);
        let first = StreamSlot::acquire(alice, 2).unwrap();
        let _second = StreamSlot::acquire(alice, 2).unwrap();
        assert!(StreamSlot::acquire(alice, 2).is_none());
        assert!(
            StreamSlot::acquire(bob, 2).is_some(),
            "other clients are not affected"
        );
        drop(first);
        assert!(StreamSlot::acquire(alice, 2).is_some());
    }

    #[tokio::test]
    async fn at_the_cap_the_oldest_idle_connection_is_shed() {
        let connections = Connections::default();
        let oldest = connections.admit(2).unwrap();
        let newer = connections.admit(2).unwrap();
        let oldest_idle = oldest.idle();
        let newer_idle = newer.idle();
        let third = connections.admit(2).expect("room made by shedding");
        oldest_idle.shed().await;
        drop(oldest_idle);
        drop(oldest);
        drop(newer_idle);
        let _busy = third;
        assert!(
            connections.admit(2).is_none(),
            "nothing idle to shed: refused"
        );
        drop(newer);
        assert!(connections.admit(2).is_some());
    }

    #[tokio::test]
    async fn a_shutdown_ends_every_idle_wait_begun_before_it_or_after() {
        let connections = Connections::default();
        let waiting = connections.admit(0).unwrap();
        let busy = connections.admit(0).unwrap();
        assert!(!waiting.closing());
        let idle = waiting.idle();
        let mut wait = std::pin::pin!(idle.shed());
        assert!(
            futures::poll!(wait.as_mut()).is_pending(),
            "waiting, registered"
        );
        connections.close_idle();
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("a wait under way ends");
        // A connection serving a request meanwhile closes after it.
        assert!(busy.closing());
        let later = busy.idle();
        tokio::time::timeout(Duration::from_secs(5), later.shed())
            .await
            .expect("a wait begun after the shutdown ends at once");
        let admitted_later = connections.admit(0).unwrap();
        assert!(admitted_later.closing(), "closes rather than wait");
    }
}
