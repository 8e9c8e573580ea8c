//! The process groups this proxy started: a command tool's call and a stdio
//! MCP server each run as the leader of a group of their own, so that a
//! signal reaches what they start in turn (`npx` starts `node`).
//!
//! A group is killed when its [`Group`] drops, or ended more gently by
//! [`Group::end`]. The process's exit drops nothing (pingora and the drain
//! leave by `std::process::exit`), so at exit each group still held is sent
//! SIGTERM, given a moment to end, and killed: a server still starting when
//! the proxy stops no longer outlives it. The groups SIGINT's fast exit drops
//! with its runtimes' tasks are left to that end too, and a group started
//! once the exit has begun (a server reconnecting) is killed at once.
//!
//! As the first process of a PID namespace (a container's entrypoint with no
//! init in front) the proxy is also the parent every orphan there falls to:
//! what a command started in the background and left behind, `npx`'s `node`
//! when its group is killed. [`Reaper`] reaps those, so they do not pile up
//! as zombies for the pod's life.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use libc::pid_t;
use pingora::server::{ExecutionPhase, ShutdownWatch};
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::broadcast::{self, error::TryRecvError};

use crate::sync::lock;

/// What the groups left at exit get between SIGTERM and SIGKILL.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// How often the groups ending at exit are looked at.
const POLL: Duration = Duration::from_millis(5);
/// How often a group ending while the proxy runs on is looked at.
const END_POLL: Duration = Duration::from_millis(20);

/// The groups held now, by id (their leaders' pids); `None` once the exit
/// has taken them.
static HELD: Mutex<Option<Vec<pid_t>>> = Mutex::new(Some(Vec::new()));
static AT_EXIT: Once = Once::new();
/// The server's phases, read as a group drops ([`follow`]).
static PHASES: Mutex<Option<broadcast::Receiver<ExecutionPhase>>> = Mutex::new(None);
/// The server's runtimes are shutting down, dropping their tasks, or the
/// process is exiting: a group dropped now is the exit's to end.
static TEARDOWN: AtomicBool = AtomicBool::new(false);

/// Follows the server's phases: a group dropped once its runtimes shut down
/// is left held, for the exit to end.
pub fn follow(phases: broadcast::Receiver<ExecutionPhase>) {
    *lock(&PHASES) = Some(phases);
}

/// Whether the process is exiting: what it started is the exit's to end,
/// and a server that ends meanwhile is not to be started again.
pub fn exiting() -> bool {
    TEARDOWN.load(Ordering::Relaxed)
}

/// Whether the server's runtimes are shutting down: pingora says so before
/// it shuts them down (the phase is sent before the tasks drop).
fn teardown() -> bool {
    if TEARDOWN.load(Ordering::Relaxed) {
        return true;
    }
    let mut phases = lock(&PHASES);
    let Some(phases) = phases.as_mut() else {
        return false;
    };
    loop {
        match phases.try_recv() {
            Ok(ExecutionPhase::ShutdownRuntimes | ExecutionPhase::Terminated)
            | Err(TryRecvError::Closed) => {
                TEARDOWN.store(true, Ordering::Relaxed);
                return true;
            }
            Ok(_) | Err(TryRecvError::Lagged(_)) => {}
            Err(TryRecvError::Empty) => return false,
        }
    }
}

/// A child's whole environment (it starts with an empty one): the proxy's
/// own values of the names in `inherit`, then `set`. A command tool's and a
/// stdio MCP server's alike: neither sees the proxy's secrets unless named.
pub fn environment<'a>(
    inherit: &[String],
    set: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = inherit
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
        .collect();
    env.extend(set.into_iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// A process group this proxy started and ends.
pub struct Group(pid_t);

impl Group {
    /// The group `leader` leads: a child spawned with `process_group(0)`.
    /// `None`, and the group killed, once the exit has begun.
    pub fn led_by(leader: u32) -> Option<Group> {
        let id = pid_t::try_from(leader).ok()?;
        AT_EXIT.call_once(|| {
            // SAFETY: registers a function of no arguments, which `exit` runs once.
            unsafe { libc::atexit(end_at_exit) };
        });
        match lock(&HELD).as_mut() {
            Some(held) => held.push(id),
            None => {
                signal_group(id, libc::SIGKILL);
                return None;
            }
        }
        Some(Group(id))
    }

    /// Ends the group as MCP's stdio shutdown asks once its stdin is
    /// closed: `grace` to end by itself, then SIGTERM and `grace` again,
    /// then SIGKILL (as it drops).
    pub async fn end(self, grace: Duration) {
        if !self.ended_within(grace).await {
            self.terminate(grace).await;
        }
    }

    /// SIGTERM, `grace` to end, then SIGKILL (as it drops).
    pub async fn terminate(self, grace: Duration) {
        signal_group(self.0, libc::SIGTERM);
        self.ended_within(grace).await;
    }

    async fn ended_within(&self, grace: Duration) -> bool {
        let deadline = Instant::now() + grace;
        loop {
            // A pass over `/proc` (a host may run thousands of processes):
            // a millisecond or so, every `END_POLL`, for a second at most.
            let ended = running(&[self.0]).is_empty();
            if ended || Instant::now() >= deadline {
                return ended;
            }
            tokio::time::sleep(END_POLL).await;
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if teardown() {
            return;
        }
        if let Some(held) = lock(&HELD).as_mut() {
            if let Some(at) = held.iter().position(|&id| id == self.0) {
                held.swap_remove(at);
            }
        }
        signal_group(self.0, libc::SIGKILL);
    }
}

fn signal_group(id: pid_t, signal: libc::c_int) {
    // SAFETY: killpg has no memory-safety preconditions; the group was
    // created for our child by `process_group(0)`, so its id is ours.
    unsafe { libc::killpg(id, signal) };
}

/// Ends the groups still held: SIGTERM, then SIGKILL for what is left
/// after [`EXIT_GRACE`]. The other threads run on meanwhile.
extern "C" fn end_at_exit() {
    TEARDOWN.store(true, Ordering::Relaxed);
    let mut left = lock(&HELD).take().unwrap_or_default();
    for &id in &left {
        signal_group(id, libc::SIGTERM);
    }
    let deadline = Instant::now() + EXIT_GRACE;
    loop {
        left = running(&left);
        if left.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(POLL);
    }
    for &id in &left {
        signal_group(id, libc::SIGKILL);
    }
}

/// Those of `groups` a process of which still runs, in one pass over
/// `/proc`. A zombie has ended, though `kill` still finds it: a grandchild
/// whose parent ended is init's to reap, which takes a while.
fn running(groups: &[pid_t]) -> Vec<pid_t> {
    let mut running = Vec::new();
    match own_proc() {
        Some(processes) => {
            for process in processes.flatten() {
                let Ok(stat) = std::fs::read_to_string(process.path().join("stat")) else {
                    continue;
                };
                if let Some(stat) = Stat::of(&stat).filter(|stat| !stat.ended()) {
                    if groups.contains(&stat.group) && !running.contains(&stat.group) {
                        running.push(stat.group);
                    }
                }
            }
        }
        // Without it, our zombies are reaped first (tokio would, later)
        // and others' still count.
        None => {
            groups.iter().for_each(|&id| reap(id));
            running.extend(groups.iter().filter(|&&id| {
                // SAFETY: kill with signal 0 only checks.
                unsafe { libc::kill(-id, 0) == 0 }
            }));
        }
    }
    running
}

/// `/proc`'s processes, if it is our PID namespace's (not, say, the host's
/// under `unshare --pid` without a mount of its own).
fn own_proc() -> Option<std::fs::ReadDir> {
    let us = std::fs::read_link("/proc/self").ok()?;
    if us.to_str()? != std::process::id().to_string() {
        return None;
    }
    std::fs::read_dir("/proc").ok()
}

/// Reaps the ended processes of group `id` that are our children.
fn reap(id: pid_t) {
    // SAFETY: waitpid with a null status pointer has no memory-safety
    // preconditions.
    while unsafe { libc::waitpid(-id, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

/// What the proxy reaps as a PID namespace's first process: each ended
/// process that fell to it. Its own children are left to tokio, which
/// collects their exit statuses: each leads its group ([`Group`]), which an
/// orphan does not. An orphan that made a session of its own, as a daemon
/// does, leads one, and stays a zombie.
pub struct Reaper;

#[async_trait]
impl BackgroundService for Reaper {
    /// Reaps until the process exits: commands run on through a drain.
    async fn start(&self, _shutdown: ShutdownWatch) {
        if std::process::id() != 1 {
            // Init, or the container's, reaps orphans.
            return;
        }
        if own_proc().is_none() {
            tracing::warn!("/proc is not this PID namespace's: orphans stay zombies");
            return;
        }
        let Ok(mut ended) = signal(SignalKind::child()) else {
            tracing::warn!("cannot watch for ended processes: orphans stay zombies");
            return;
        };
        loop {
            reap_orphans(1);
            if ended.recv().await.is_none() {
                return;
            }
        }
    }
}

/// Reaps the ended processes whose parent is `us` that lead no group.
fn reap_orphans(us: pid_t) {
    let Some(processes) = own_proc() else {
        return;
    };
    for process in processes.flatten() {
        let Some(pid) = process.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(process.path().join("stat")) else {
            continue;
        };
        if Stat::of(&stat).is_some_and(|stat| stat.orphan_ended(pid, us)) {
            // SAFETY: waitpid with a null status pointer has no memory-safety
            // preconditions; `pid` is our child, and no one else's to wait for.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }
}

/// The fields of a process's `/proc/<pid>/stat` we read: they follow its
/// name, which is in parentheses and may hold anything.
struct Stat<'a> {
    state: &'a str,
    parent: pid_t,
    group: pid_t,
}

impl<'a> Stat<'a> {
    fn of(stat: &'a str) -> Option<Stat<'a>> {
        let mut fields = stat.rsplit_once(')')?.1.split_ascii_whitespace();
        Some(Stat {
            state: fields.next()?,
            parent: fields.next()?.parse().ok()?,
            group: fields.next()?.parse().ok()?,
        })
    }

    /// A zombie (or one being reaped): it no longer runs.
    fn ended(&self) -> bool {
        matches!(self.state, "Z" | "X")
    }

    /// Whether process `pid`, of this stat, is `us`'s, ended, and leads no
    /// group (so is none of the children we started).
    fn orphan_ended(&self, pid: pid_t, us: pid_t) -> bool {
        self.ended() && self.parent == us && self.group != pid
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    fn stat(state: &str, group: pid_t) -> String {
        format!("4242 (node (a) b) {state} 1 {group} {group} 0 -1 4194560 0")
    }

    #[test]
    fn a_stat_says_whether_a_process_ended_and_its_group() {
        let text = stat("S", 777);
        let running = Stat::of(&text).unwrap();
        assert!(!running.ended());
        assert_eq!((running.parent, running.group), (1, 777));
        assert!(Stat::of(&stat("Z", 777)).unwrap().ended());
        assert!(Stat::of("garbage").is_none());
    }

    #[test]
    fn an_orphan_is_reaped_and_a_child_we_started_is_not() {
        let orphan = |state, group, us| {
            Stat::of(&stat(state, group))
                .unwrap()
                .orphan_ended(4242, us)
        };
        assert!(orphan("Z", 777, 1), "ended, ours, in another's group");
        assert!(!orphan("S", 777, 1), "still running");
        assert!(!orphan("Z", 777, 2), "another's");
        assert!(
            !orphan("Z", 4242, 1),
            "a group's leader: a child we started, whose end tokio reads"
        );
    }

    #[test]
    fn a_group_ends_when_its_processes_have_ended() {
        // A leader that started another process, as `npx` starts `node`.
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .process_group(0)
            .spawn()
            .expect("sh starts");
        let id = pid_t::try_from(leader.id()).expect("a pid");
        assert_eq!(running(&[id, 4_000_000]), [id]);
        signal_group(id, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !running(&[id]).is_empty() {
            assert!(Instant::now() < deadline, "the group did not end");
            std::thread::sleep(POLL);
        }
        assert!(
            leader.try_wait().expect("ours to reap").is_some(),
            "a zombie, which `running` counts as ended"
        );
    }
}
