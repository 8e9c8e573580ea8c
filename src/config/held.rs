//! A request's hold on the config it began with.
//!
//! Every request held an `Arc` of the live config and cloned it on its way
//! (the front door, the forwarder): each clone and drop wrote the one count
//! of that `Arc`, which both cores' requests shared, so its line moved
//! between the cores a few times a request (`per_thread`). A thread's
//! requests now share a handle of their own on it: their clones count there.

use std::cell::RefCell;
use std::ops::Deref;
use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;

use super::Config;

/// A config as a request holds it: cheap to clone on the thread it was
/// taken on.
#[derive(Clone)]
#[expect(
    clippy::redundant_allocation,
    reason = "the outer count is the thread's, the inner one every thread's"
)]
pub struct Held(Arc<Arc<Config>>);

impl Held {
    /// The live config, through the thread's handle on it while the thread
    /// has requests that hold it. Weak in between: a config replaced by a
    /// reload (its MCP servers, its store) is not kept by an idle thread.
    pub fn current(live: &ArcSwap<Config>) -> Held {
        thread_local! {
            static HANDLE: RefCell<Weak<Arc<Config>>> = const { RefCell::new(Weak::new()) };
        }
        let now = live.load();
        HANDLE.with(|handle| {
            let mut handle = handle.borrow_mut();
            match handle.upgrade() {
                Some(held) if Arc::ptr_eq(&*held, &*now) => Held(held),
                _ => {
                    let held = Arc::new(arc_swap::Guard::into_inner(now));
                    *handle = Arc::downgrade(&held);
                    Held(held)
                }
            }
        })
    }
}

impl Deref for Held {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Arc<Config> {
        let yaml =
            "default_upstream: local\nupstreams: { local: { url: 'http://127.0.0.1:8080/v1' } }";
        Arc::new(Config::parse(yaml, |_| None).unwrap())
    }

    #[test]
    fn a_threads_requests_share_a_handle_and_an_idle_thread_keeps_no_config() {
        let live = ArcSwap::new(config());
        let first = Held::current(&live);
        let second = Held::current(&live);
        assert!(Arc::ptr_eq(&first.0, &second.0), "one handle on a thread");
        assert_eq!(
            Arc::strong_count(&live.load_full()),
            3,
            "the live one, the handle, this"
        );
        // A reload: requests begun after it hold the new config.
        let old = Arc::downgrade(&live.load_full());
        live.store(config());
        let third = Held::current(&live);
        assert!(Arc::ptr_eq(&*third.0, &live.load_full()));
        assert!(!Arc::ptr_eq(&third.0, &first.0));
        drop((first, second));
        assert!(
            old.upgrade().is_none(),
            "the old config is gone with its requests"
        );
    }
}
