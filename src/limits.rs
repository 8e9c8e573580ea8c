//! Open event streams per client, so one client cannot hold every
//! connection the proxy and its upstreams have; and open client connections,
//! so idle ones cannot use up the process's file descriptors.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

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
#[derive(Default)]
pub struct Connections(Mutex<Registry>);

#[derive(Default)]
struct Registry {
    open: usize,
    /// Idle connections by when they became idle (a sequence number): the
    /// first is the oldest.
    idle: BTreeMap<u64, Arc<Notify>>,
    next: u64,
}

/// One open connection; counted until dropped.
pub struct Connection<'a> {
    registry: &'a Connections,
    shed: Arc<Notify>,
}

/// A connection waiting for its next request, sheddable until dropped.
pub struct Idle<'a> {
    connection: &'a Connection<'a>,
    since: u64,
}

impl Connections {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new connection, unless `max` are open (0: no limit) and none
    /// of them is idle to close instead.
    pub fn admit(&self, max: usize) -> Option<Connection<'_>> {
        let mut registry = self.registry();
        if max > 0 && registry.open >= max {
            let (_, oldest) = registry.idle.pop_first()?;
            oldest.notify_one();
        }
        registry.open += 1;
        Some(Connection {
            registry: self,
            shed: Arc::default(),
        })
    }
}

impl Connection<'_> {
    /// Marks the connection idle until the returned guard is dropped.
    pub fn idle(&self) -> Idle<'_> {
        let mut registry = self.registry.registry();
        let since = registry.next;
        registry.next += 1;
        registry.idle.insert(since, self.shed.clone());
        Idle {
            connection: self,
            since,
        }
    }
}

impl Idle<'_> {
    /// Resolves when the connection was chosen to make room for another. A
    /// choice made just as a request arrived is kept for the next idle wait.
    pub async fn shed(&self) {
        self.connection.shed.notified().await;
    }
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        let mut registry = self.connection.registry.registry();
        registry.idle.remove(&self.since);
    }
}

impl Drop for Connection<'_> {
    fn drop(&mut self) {
        self.registry.registry().open -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
