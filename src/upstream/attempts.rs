//! The attempts of one request on pingora's proxy path: pingora connects by
//! itself, and after a failure marked for retry asks for a peer again. The
//! next one is the same replica's next address while it has one, then the
//! next replica while retries remain.

use std::sync::Arc;

use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, Result};

use super::{Busy, Upstream};
use crate::http_client::Peers;

#[derive(Default)]
pub struct ProxyAttempts {
    /// Replicas tried, in order; the last is the current one.
    tried: Vec<usize>,
    /// The current replica's addresses, where its attempts started, and how
    /// many of them failed.
    peers: Option<Arc<Peers>>,
    start: usize,
    failed: usize,
    /// The last failure leaves an address of the current replica to try.
    same_replica: bool,
    busy: Option<Busy>,
}

impl ProxyAttempts {
    /// The peer for the next attempt.
    pub async fn next_peer(&mut self, upstream: &Upstream) -> Result<Box<HttpPeer>> {
        let peers = match self.peers.clone().filter(|_| self.same_replica) {
            Some(peers) => peers,
            None => {
                let pool = &upstream.pool;
                let order = pool.order(None);
                let index = order
                    .iter()
                    .copied()
                    .find(|i| !self.tried.contains(i))
                    .unwrap_or(order[0]);
                self.tried.push(index);
                let member = pool.member(index);
                self.busy = Some(Busy::enter(member));
                let peers = member.endpoint.peers().await?;
                self.start = peers.preferred();
                self.failed = 0;
                self.peers = Some(peers.clone());
                peers
            }
        };
        self.same_replica = false;
        Ok(Box::new(HttpPeer::clone(
            peers.peer(self.start + self.failed),
        )))
    }

    /// pingora's connect failed: marks the error for a retry when an address
    /// or a replica is left to try.
    pub fn connect_failed(&mut self, upstream: &Upstream, error: Box<Error>) -> Box<Error> {
        let Some(&index) = self.tried.last() else {
            return error;
        };
        let member = upstream.pool.member(index);
        let mut error = member.tag_error(error);
        if let Some(peers) = &self.peers {
            peers.failed((self.start + self.failed) % peers.count());
            self.failed += 1;
            if self.failed < peers.count() {
                self.same_replica = true;
                error.set_retry(true);
                return error;
            }
        }
        upstream.pool.connect_failed(index);
        if self.tried.len() <= upstream.retries() && self.tried.len() < upstream.pool.size() {
            error.set_retry(true);
        }
        error
    }

    /// The replica the request is going to.
    pub fn replica(&self) -> usize {
        self.tried.last().copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use pingora::upstreams::peer::Peer;
    use pingora::ErrorType;

    use super::*;
    use crate::config::file::UpstreamFile;

    fn refused() -> Box<Error> {
        Error::new(ErrorType::ConnectRefused)
    }

    #[tokio::test]
    async fn a_refused_address_is_followed_by_the_replicas_next_address_then_the_next_replica() {
        let file: UpstreamFile = serde_yaml_ng::from_str(
            "endpoints: ['http://localhost:9/v1', 'http://127.0.0.1:10/v1']\nhealth_check: { enabled: false }",
        )
        .unwrap();
        let upstream = Upstream::from_file("t", file).unwrap();
        let mut attempts = ProxyAttempts::default();
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
}
