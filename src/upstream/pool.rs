//! A pool of replicas behind one upstream: which one a request tries first,
//! which next, and which are healthy.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tracing::{info, warn};

use crate::config::file::Balance;
use crate::error::AtEndpoint;
use crate::http_client::{Endpoint, Request};

/// Failed checks in a row before a replica leaves the rotation.
const FAILS_TO_EJECT: u32 = 2;

pub struct Member {
    pub endpoint: Endpoint,
    pub url: String,
    healthy: AtomicBool,
    failed_checks: AtomicU32,
    /// On lines of its own: written by every request where it is read.
    in_flight: crossbeam_utils::CachePadded<AtomicUsize>,
}

impl Member {
    fn new(endpoint: Endpoint, url: String) -> Self {
        Member {
            endpoint,
            url,
            healthy: AtomicBool::new(true),
            failed_checks: AtomicU32::new(0),
            in_flight: Default::default(),
        }
    }

    /// `error` marked as having happened at this member, so the client's
    /// message can name where.
    pub fn tag_error(&self, error: Box<pingora::Error>) -> Box<pingora::Error> {
        AtEndpoint::wrap(self.endpoint.origin(), error)
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    fn set_healthy(&self, healthy: bool, pool: &str) {
        if self.healthy.swap(healthy, Ordering::Relaxed) != healthy {
            if healthy {
                info!(upstream = pool, endpoint = %self.url, "endpoint healthy again");
            } else {
                warn!(upstream = pool, endpoint = %self.url, "endpoint unhealthy: out of rotation");
            }
        }
    }
}

/// Counts a request on a member while it lives (for `least_in_flight`).
pub struct Busy(Arc<Member>);

impl Busy {
    fn enter(member: &Arc<Member>) -> Self {
        member.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(member.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct HealthCheck {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
}

pub struct Pool {
    name: String,
    members: Vec<Arc<Member>>,
    balance: Balance,
    next: AtomicUsize,
    health: Option<HealthCheck>,
    last_check: Mutex<Option<Instant>>,
}

impl Pool {
    pub fn new(
        name: &str,
        members: Vec<(Endpoint, String)>,
        balance: Balance,
        health: Option<HealthCheck>,
    ) -> Self {
        Pool {
            name: name.to_owned(),
            members: members
                .into_iter()
                .map(|(endpoint, url)| Arc::new(Member::new(endpoint, url)))
                .collect(),
            balance,
            next: AtomicUsize::new(0),
            health,
            last_check: Mutex::new(None),
        }
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    pub fn member(&self, index: usize) -> &Arc<Member> {
        &self.members[index % self.members.len()]
    }

    /// A request counted on member `index` while it lives, where the choice
    /// of a member reads the counts (`least_in_flight` among several): a
    /// count that every request on both cores writes moves its line between
    /// them at each write, and puts the member's other fields out of cache.
    pub fn busy(&self, index: usize) -> Option<Busy> {
        (self.balance == Balance::LeastInFlight && self.members.len() > 1)
            .then(|| Busy::enter(self.member(index)))
    }

    /// Whether [`order`](Self::order) reads a request's conversation key:
    /// the key is worth its hash only then.
    pub fn ranks_by_conversation(&self) -> bool {
        self.balance == Balance::PrefixAffinity && self.members.len() > 1
    }

    /// A request's conversation key, where this pool ranks by one: by the
    /// client's key for the conversation (`session`), else by how the
    /// conversation begins (`beginning`, an [`affinity_key`]).
    pub fn conversation_key(
        &self,
        session: Option<&str>,
        beginning: impl FnOnce() -> u64,
    ) -> Option<u64> {
        if !self.ranks_by_conversation() {
            return None;
        }
        Some(match session {
            Some(session) => session_key(session),
            None => beginning(),
        })
    }

    /// The members in the order a request tries them: the balancing choice
    /// first, healthy members before unhealthy ones (which are still tried
    /// last rather than failing outright). `affinity` is the conversation
    /// key for `prefix_affinity`.
    pub fn order(&self, affinity: Option<u64>) -> Vec<usize> {
        let n = self.members.len();
        let mut order: Vec<usize> = match self.balance {
            _ if n == 1 => vec![0],
            Balance::RoundRobin => {
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                (0..n).map(|i| (start + i) % n).collect()
            }
            Balance::LeastInFlight => {
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                let mut order: Vec<usize> = (0..n).map(|i| (start + i) % n).collect();
                order.sort_by_key(|&i| self.members[i].in_flight.load(Ordering::Relaxed));
                order
            }
            Balance::PrefixAffinity => match affinity {
                // Rendezvous hashing: each key ranks the members its own
                // way, so removing one moves only the keys it owned.
                Some(key) => {
                    let mut order: Vec<usize> = (0..n).collect();
                    order.sort_by_key(|&i| std::cmp::Reverse(rank(key, &self.members[i].url)));
                    order
                }
                None => {
                    let start = self.next.fetch_add(1, Ordering::Relaxed);
                    (0..n).map(|i| (start + i) % n).collect()
                }
            },
        };
        order.sort_by_key(|&i| !self.members[i].is_healthy());
        order
    }

    /// A connect failure during traffic takes the member out at once when
    /// health checks will bring it back.
    pub fn connect_failed(&self, index: usize) {
        if self.health.is_some() {
            self.member(index).set_healthy(false, &self.name);
        }
    }

    pub fn has_health_checks(&self) -> bool {
        self.health.is_some()
    }

    /// When the next round of health checks is due; `None` without them.
    pub fn health_due_at(&self) -> Option<Instant> {
        let health = self.health.as_ref()?;
        Some(due_after(*self.last_check(), health).unwrap_or_else(Instant::now))
    }

    fn last_check(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // A plain timestamp: a poisoned lock still holds a usable value.
        self.last_check.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one round of health checks if one is due; `None` if none was,
    /// else what the round's verdict makes of the pool: `Err` says why no
    /// replica is in rotation.
    pub async fn check_health_if_due(&self) -> Option<Result<(), String>> {
        let health = self.health.as_ref()?;
        {
            let mut last = self.last_check();
            let now = Instant::now();
            if due_after(*last, health).is_some_and(|at| at > now) {
                return None;
            }
            *last = Some(now);
        }
        join_all(self.members.iter().map(|member| async move {
            let ok = probe(member, health).await;
            if ok {
                member.failed_checks.store(0, Ordering::Relaxed);
                member.set_healthy(true, &self.name);
            } else if member.failed_checks.fetch_add(1, Ordering::Relaxed) + 1 >= FAILS_TO_EJECT {
                member.set_healthy(false, &self.name);
            }
        }))
        .await;
        if self.members.iter().any(|m| m.is_healthy()) {
            Some(Ok(()))
        } else {
            Some(Err(format!(
                "no endpoint passes its health check (GET {})",
                health.path
            )))
        }
    }
}

/// When a round of checks is due after the `last` one; `None`: at once
/// (there was none).
fn due_after(last: Option<Instant>, health: &HealthCheck) -> Option<Instant> {
    last.map(|at| at + health.interval)
}

async fn probe(member: &Member, health: &HealthCheck) -> bool {
    let check = async {
        let req = Request::new("GET", &health.path).ok()?;
        let mut exchange = member.endpoint.send(req, None).await.ok()?;
        let status = exchange.status();
        let _ = exchange.read_to_end(64 * 1024).await;
        Some((200..300).contains(&status))
    };
    matches!(
        tokio::time::timeout(health.timeout, check).await,
        Ok(Some(true))
    )
}

fn rank(key: u64, url: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    url.hash(&mut hasher);
    hasher.finish()
}

/// No system prompt, for [`affinity_key`].
pub const NO_SYSTEM: Option<[&str; 0]> = None;

/// The conversation key for `prefix_affinity` of a client's session id.
pub fn session_key(session: &str) -> u64 {
    affinity_key(NO_SYSTEM, Some(session))
}

/// The conversation key for `prefix_affinity`: the system prompt (its text,
/// in pieces) and the first user message, which stay the same for the
/// whole conversation. The hash of `Option<&str>`s of the joined text, as
/// earlier versions keyed it: replicas mid-upgrade, and a restarted one,
/// send a conversation on to the same model server (and its prompt cache).
pub fn affinity_key<'a>(
    system: Option<impl IntoIterator<Item = &'a str>>,
    first_user: Option<&str>,
) -> u64 {
    let mut hasher = DefaultHasher::new();
    // What `Option<&str>::hash` writes: the variant, then the text as `str::hash`.
    match system {
        None => hasher.write_isize(0),
        Some(pieces) => {
            hasher.write_isize(1);
            pieces
                .into_iter()
                .for_each(|piece| hasher.write(piece.as_bytes()));
            hasher.write_u8(0xff);
        }
    }
    first_user.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_client::{EndpointOptions, Timeouts};

    fn pool(balance: Balance, n: usize) -> Pool {
        let members = (0..n)
            .map(|i| {
                let url = format!("http://127.0.0.1:{}/v1", 9000 + i);
                let options = EndpointOptions {
                    timeouts: Timeouts::all(Duration::from_secs(1)),
                    ca_file: None,
                };
                (Endpoint::parse(&url, options).unwrap(), url)
            })
            .collect();
        let health = HealthCheck {
            path: "/health".into(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        };
        Pool::new("p", members, balance, Some(health))
    }

    #[test]
    fn round_robin_rotates_and_skips_unhealthy_first() {
        let p = pool(Balance::RoundRobin, 3);
        let firsts: Vec<usize> = (0..6).map(|_| p.order(None)[0]).collect();
        assert_eq!(firsts, [0, 1, 2, 0, 1, 2]);
        p.connect_failed(1);
        let order = p.order(None);
        assert_eq!(
            *order.last().unwrap(),
            1,
            "unhealthy members are tried last"
        );
        assert!((0..6).all(|_| p.order(None)[0] != 1));
    }

    #[test]
    fn prefix_affinity_is_stable_and_moves_only_the_lost_members_keys() {
        let p = pool(Balance::PrefixAffinity, 4);
        let keys: Vec<u64> = (0..200)
            .map(|i| affinity_key(Some(["sys"]), Some(&format!("q{i}"))))
            .collect();
        let before: Vec<usize> = keys.iter().map(|&k| p.order(Some(k))[0]).collect();
        assert_eq!(
            before,
            keys.iter()
                .map(|&k| p.order(Some(k))[0])
                .collect::<Vec<_>>()
        );
        let used: std::collections::BTreeSet<_> = before.iter().collect();
        assert_eq!(used.len(), 4, "keys spread over the pool");
        p.connect_failed(2);
        for (&k, &was) in keys.iter().zip(&before) {
            let now = p.order(Some(k))[0];
            if was != 2 {
                assert_eq!(now, was, "a key whose member stayed healthy did not move");
            } else {
                assert_ne!(now, 2);
            }
        }
    }

    #[test]
    fn affinity_keys_are_those_of_the_joined_text_as_earlier_versions_made_them() {
        // Earlier versions hashed `Option<&str>`s of the joined system prompt
        // and the first user message: a replica mid-upgrade must agree.
        let earlier = |system: Option<&str>, first_user: Option<&str>| {
            let mut hasher = DefaultHasher::new();
            system.hash(&mut hasher);
            first_user.hash(&mut hasher);
            hasher.finish()
        };
        let pieces = ["You are terse.", "\n\n", "Answer in French.", "\n", "Cite."];
        assert_eq!(
            affinity_key(Some(pieces), Some("hi")),
            earlier(Some(&pieces.concat()), Some("hi"))
        );
        assert_eq!(
            affinity_key(Some(["sys"]), None),
            earlier(Some("sys"), None)
        );
        assert_eq!(session_key("s"), earlier(None, Some("s")));
        assert_eq!(affinity_key(NO_SYSTEM, None), earlier(None, None));
        // An empty prompt is a prompt, as it was.
        assert_ne!(
            affinity_key(Some([""]), None),
            affinity_key(NO_SYSTEM, None)
        );
    }

    #[test]
    fn least_in_flight_prefers_the_idle_member() {
        let p = pool(Balance::LeastInFlight, 2);
        let _busy = Busy::enter(p.member(0));
        assert!((0..4).all(|_| p.order(None)[0] == 1));
    }
}
