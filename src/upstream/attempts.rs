//! The one retry and replica policy of a request to an upstream, shared by
//! both ways out: [`Upstream::send`] (agent calls, chat passthrough, the
//! proxy's own calls, over `http_client`) and pingora's proxy path (the
//! `upstream_peer` and `fail_to_connect` hooks, over pingora's own engine).
//!
//! - **Which replica next**: the pool's order, fixed at the request's first
//!   attempt (healthy first, then affinity or least-busy, see [`Pool::order`]).
//! - **When a failure may move on**: a connect failure always (nothing reached
//!   the server); any other failure only for an idempotent request (`GET`,
//!   `HEAD`), as the server may have acted on one written whole; a 5xx answer
//!   only while the caller still holds it (no byte reached the client).
//! - **How far**: `retries` other replicas, never one twice.
//! - **Health**: a replica that refused a connection leaves the rotation when
//!   health checks will bring it back.
//! - **Metrics**: every failed attempt counts once in
//!   `agent_proxy_upstream_errors_total`, by kind.
//!
//! The addresses of one replica are not replicas: `http_client` races them
//! within one attempt (happy eyeballs); on pingora's path, which connects to
//! one address at a time, a failed address is followed by the replica's next
//! one before the attempt counts as failed.
//!
//! [`Pool::order`]: super::Pool::order

use std::sync::Arc;

use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType, Result};

use super::{is_connect_failure, Busy, Upstream};
use crate::http_client::{Peers, Watch};
use crate::metrics::metrics;

pub struct Attempts {
    affinity: Option<u64>,
    idempotent: bool,
    /// The replicas in the order this request tries them, taken at its
    /// first attempt.
    order: Vec<usize>,
    /// Replicas begun; the last is the current one.
    begun: usize,
    /// The current attempt's failure was counted already.
    counted: bool,
    /// Counts the current replica's load while the request is on it.
    busy: Option<Busy>,
    /// pingora's path only: the current replica's addresses.
    addresses: Option<Addresses>,
}

/// Where pingora's attempts on one replica stand among its addresses.
struct Addresses {
    peers: Arc<Peers>,
    start: usize,
    failed: usize,
    /// The last failure left an address of this replica to try.
    try_next: bool,
}

impl Attempts {
    /// The attempts of one request; `affinity` is its conversation key for
    /// `prefix_affinity`, `method` decides whether it may be sent twice.
    pub fn new(affinity: Option<u64>, method: &str) -> Self {
        Attempts {
            affinity,
            idempotent: matches!(method, "GET" | "HEAD"),
            order: Vec::new(),
            begun: 0,
            counted: false,
            busy: None,
            addresses: None,
        }
    }

    /// The replica the next attempt goes to, or `None` when the request may
    /// go to no other.
    pub fn next_replica(&mut self, upstream: &Upstream) -> Option<usize> {
        if self.order.is_empty() {
            self.order = upstream.pool.order(self.affinity);
        } else if !self.may_move_on(upstream) {
            return None;
        }
        let index = *self.order.get(self.begun)?;
        self.begun += 1;
        self.counted = false;
        self.addresses = None;
        self.busy = upstream.pool.busy(index);
        Some(index)
    }

    /// The replica the request is on.
    pub fn replica(&self) -> usize {
        self.begun
            .checked_sub(1)
            .and_then(|i| self.order.get(i).copied())
            .unwrap_or(0)
    }

    fn may_move_on(&self, upstream: &Upstream) -> bool {
        self.begun <= upstream.retries() && self.begun < self.order.len()
    }

    /// The current attempt failed before an answer: counted, a refusing
    /// replica marked for health. Whether the request may go to another.
    pub fn failed(&mut self, upstream: &Upstream, error: &Error) -> bool {
        self.count(upstream, error.etype().as_str());
        let connect = is_connect_failure(error.etype());
        if connect {
            upstream.pool.connect_failed(self.replica());
        }
        (connect || self.idempotent) && self.may_move_on(upstream)
    }

    /// The current attempt was answered with `status`, and the caller still
    /// holds the answer: whether to drop it for another replica's (a 5xx,
    /// while one is left).
    pub fn answered(&mut self, upstream: &Upstream, status: u16) -> bool {
        self.count_status(upstream, status);
        status >= 500 && self.may_move_on(upstream)
    }

    /// The answer went on to the client as it came (pingora's path): it is
    /// counted, never retried.
    pub fn passed_on(&mut self, upstream: &Upstream, status: u16) {
        self.count_status(upstream, status);
    }

    /// The request failed after its last attempt began (a timeout waiting
    /// for the answer, an answer cut short): counted, unless it was already.
    pub fn broke_off(&mut self, upstream: &Upstream, error: &Error) {
        self.count(upstream, error.etype().as_str());
    }

    fn count_status(&mut self, upstream: &Upstream, status: u16) {
        match status {
            500.. => self.count(upstream, "http_5xx"),
            400..500 => self.count(upstream, "http_4xx"),
            _ => {}
        }
    }

    fn count(&mut self, upstream: &Upstream, kind: &str) {
        if !std::mem::replace(&mut self.counted, true) {
            metrics().upstream_error(&upstream.name, kind);
        }
    }

    /// What the exchange of the attempt that answered keeps: the replica's
    /// load, and the counting of a failure while its answer is read.
    pub fn answer_watch(self, upstream: &Upstream) -> Box<dyn Watch> {
        Box::new(Answer {
            upstream: upstream.name.clone(),
            counted: self.counted,
            _busy: self.busy,
        })
    }

    /// The peer for pingora's next attempt: the current replica's next
    /// address after one failed, else the next replica's preferred address.
    pub async fn next_peer(&mut self, upstream: &Upstream) -> Result<Box<HttpPeer>> {
        if let Some(at) = self.addresses.as_mut().filter(|a| a.try_next) {
            at.try_next = false;
            return Ok(Box::new(HttpPeer::clone(
                at.peers.peer(at.start + at.failed),
            )));
        }
        loop {
            let Some(index) = self.next_replica(upstream) else {
                return Err(Error::new(ErrorType::ConnectNoRoute).into_up());
            };
            let member = upstream.pool.member(index);
            match member.endpoint.peers().await {
                Ok(peers) => {
                    let start = peers.preferred();
                    let peer = Box::new(HttpPeer::clone(peers.peer(start)));
                    self.addresses = Some(Addresses {
                        peers,
                        start,
                        failed: 0,
                        try_next: false,
                    });
                    return Ok(peer);
                }
                // The name does not resolve: a connect failure like any other.
                Err(e) => {
                    if !self.failed(upstream, &e) {
                        return Err(member.tag_error(e));
                    }
                }
            }
        }
    }

    /// pingora's connect failed: the error, marked for a retry when an
    /// address of this replica or another replica is left to try.
    pub fn connect_failed(&mut self, upstream: &Upstream, error: Box<Error>) -> Box<Error> {
        let mut error = upstream.pool.member(self.replica()).tag_error(error);
        if let Some(at) = self.addresses.as_mut() {
            at.peers.failed((at.start + at.failed) % at.peers.count());
            at.failed += 1;
            if at.failed < at.peers.count() {
                at.try_next = true;
                error.set_retry(true);
                return error;
            }
        }
        let again = self.failed(upstream, &error);
        error.set_retry(again);
        error
    }
}

/// Held by the exchange that answered.
struct Answer {
    upstream: String,
    counted: bool,
    _busy: Option<Busy>,
}

impl Watch for Answer {
    fn read_failed(&mut self, error: &Error) {
        if !std::mem::replace(&mut self.counted, true) {
            metrics().upstream_error(&self.upstream, error.etype().as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use pingora::upstreams::peer::Peer;

    use super::*;
    use crate::config::file::UpstreamFile;

    fn upstream(yaml: &str) -> Upstream {
        let file: UpstreamFile = serde_yaml_ng::from_str(yaml).unwrap();
        Upstream::from_file("t", file).unwrap()
    }

    fn refused() -> Box<Error> {
        Error::new(ErrorType::ConnectRefused)
    }

    #[tokio::test]
    async fn a_refused_address_is_followed_by_the_replicas_next_address_then_the_next_replica() {
        let upstream = upstream(
            "endpoints: ['http://localhost:9/v1', 'http://127.0.0.1:10/v1']\nhealth_check: { enabled: false }",
        );
        let mut attempts = Attempts::new(None, "POST");
        let expected = [(0, "[::1]:9"), (0, "127.0.0.1:9"), (1, "127.0.0.1:10")];
        for (attempt, (replica, address)) in expected.into_iter().enumerate() {
            if attempt > 0 {
                assert!(attempts.connect_failed(&upstream, refused()).retry());
            }
            let peer = attempts.next_peer(&upstream).await.unwrap();
            assert_eq!(attempts.replica(), replica);
            assert_eq!(peer.address().to_string(), address);
        }
        assert!(
            !attempts.connect_failed(&upstream, refused()).retry(),
            "every address of every replica failed"
        );
    }

    #[test]
    fn retries_bound_the_replicas_and_only_safe_requests_move_on_after_a_write() {
        let three = "endpoints: ['http://a:1/v1', 'http://b:1/v1', 'http://c:1/v1']\nhealth_check: { enabled: false }";
        let upstream = upstream(&format!("{three}\nretries: 1"));
        let timeout = Error::new(ErrorType::ReadTimedout);

        let mut post = Attempts::new(None, "POST");
        let first = post.next_replica(&upstream).unwrap();
        assert!(
            post.failed(&upstream, &refused()),
            "a refused connect moves on"
        );
        let second = post.next_replica(&upstream).unwrap();
        assert_ne!(first, second);
        assert!(!post.failed(&upstream, &refused()), "retries: 1");
        assert_eq!(post.next_replica(&upstream), None);

        let mut post = Attempts::new(None, "POST");
        post.next_replica(&upstream);
        assert!(
            !post.failed(&upstream, &timeout),
            "a POST written whole may have been acted on"
        );
        let mut get = Attempts::new(None, "GET");
        get.next_replica(&upstream);
        assert!(get.failed(&upstream, &timeout), "a GET may be sent again");

        let mut held = Attempts::new(None, "POST");
        held.next_replica(&upstream);
        assert!(held.answered(&upstream, 503));
        held.next_replica(&upstream);
        assert!(!held.answered(&upstream, 503), "the last answer is kept");
        assert!(!Attempts::new(None, "POST").answered(&upstream, 429));
    }
}
