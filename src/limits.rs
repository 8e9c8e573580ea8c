//! Open event streams per client, so one client cannot hold every
//! connection the proxy and its upstreams have.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, OnceLock};

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
}
