//! The process groups this proxy started: a command tool's call and a stdio
//! MCP server each run as the leader of a group of their own, so that a
//! signal reaches what they start in turn (`npx` starts `node`).
//!
//! A group is killed when its [`Group`] drops. The process's exit drops
//! nothing (pingora and the drain leave by `std::process::exit`), so at exit
//! each group still held is sent SIGTERM, given a moment to end, and killed:
//! a server still starting when the proxy stops no longer outlives it.
//!
//! As the first process of a PID namespace (a container's entrypoint with no
//! init in front) the proxy is also the parent every orphan there falls to:
//! what a command started in the background and left behind, `npx`'s `node`
//! when its group is killed. [`Reaper`] reaps those, so they do not pile up
//! as zombies for the pod's life.

use std::sync::{Mutex, MutexGuard, Once, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use libc::pid_t;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, SignalKind};

/// What the groups left at exit get between SIGTERM and SIGKILL.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// The groups held now, by id (their leaders' pids).
static HELD: Mutex<Vec<pid_t>> = Mutex::new(Vec::new());
static AT_EXIT: Once = Once::new();

/// A process group this proxy started and ends.
pub struct Group(pid_t);

impl Group {
    /// The group `leader` leads: a child spawned with `process_group(0)`.
    pub fn led_by(leader: u32) -> Option<Group> {
        let id = pid_t::try_from(leader).ok()?;
        AT_EXIT.call_once(|| {
            // SAFETY: registers a function of no arguments, which `exit` runs once.
            unsafe { libc::atexit(end_at_exit) };
        });
        held().push(id);
        Some(Group(id))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let mut held = held();
        if let Some(at) = held.iter().position(|&id| id == self.0) {
            held.swap_remove(at);
        }
        drop(held);
        // SAFETY: killpg has no memory-safety preconditions; the group was
        // created for our child by `process_group(0)`, so its id is ours.
        unsafe { libc::killpg(self.0, libc::SIGKILL) };
    }
}

fn held() -> MutexGuard<'static, Vec<pid_t>> {
    // A list of numbers: a poisoned lock still holds a usable one.
    HELD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Ends the groups still held: SIGTERM, then SIGKILL for what is left
/// after [`EXIT_GRACE`].
extern "C" fn end_at_exit() {
    let mut left = std::mem::take(&mut *held());
    for &id in &left {
        // SAFETY: as in `Group::drop`.
        unsafe { libc::killpg(id, libc::SIGTERM) };
    }
    let deadline = Instant::now() + EXIT_GRACE;
    loop {
        left.retain(|&id| alive(id));
        if left.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for &id in &left {
        // SAFETY: as in `Group::drop`.
        unsafe { libc::killpg(id, libc::SIGKILL) };
    }
}

/// Whether a process of group `id` still runs. A zombie has ended, though
/// `kill` still finds it: a grandchild whose parent ended is init's to reap,
/// which takes a while. Ours are reaped once none runs.
fn alive(id: pid_t) -> bool {
    let runs = match std::fs::read_dir("/proc") {
        Ok(processes) => processes.flatten().any(|process| {
            std::fs::read_to_string(process.path().join("stat"))
                .is_ok_and(|stat| runs_in(&stat, id))
        }),
        // No `/proc`: our zombies reaped first, others' still count.
        Err(_) => {
            reap(id);
            // SAFETY: kill with signal 0 only checks.
            unsafe { libc::kill(-id, 0) == 0 }
        }
    };
    if !runs {
        reap(id);
    }
    runs
}

/// Reaps the ended processes of group `id` that are our children.
fn reap(id: pid_t) {
    // SAFETY: waitpid with a null status pointer has no memory-safety
    // preconditions.
    while unsafe { libc::waitpid(-id, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

/// Whether a process's `/proc/<pid>/stat` says it runs in group `id`.
fn runs_in(stat: &str, id: pid_t) -> bool {
    Stat::of(stat).is_some_and(|stat| !stat.ended() && stat.group == id)
}

/// What the proxy reaps as a PID namespace's first process: each ended
/// process that fell to it. Its own children are left to tokio, which
/// collects their exit statuses: each leads its group ([`Group`]), which an
/// orphan does not (unless it made a session of its own, as a daemon does).
pub struct Reaper;

#[async_trait]
impl BackgroundService for Reaper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if std::process::id() != 1 {
            // Init, or the container's, reaps orphans.
            return;
        }
        let Ok(mut ended) = signal(SignalKind::child()) else {
            tracing::warn!("cannot watch for ended processes: orphans stay zombies");
            return;
        };
        loop {
            reap_orphans(1);
            tokio::select! {
                _ = ended.recv() => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Reaps the ended processes whose parent is `us` that lead no group.
fn reap_orphans(us: pid_t) {
    let Ok(processes) = std::fs::read_dir("/proc") else {
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
    fn a_process_runs_in_its_group_until_it_is_a_zombie() {
        assert!(runs_in(&stat("S", 777), 777));
        assert!(runs_in(&stat("R", 777), 777));
        assert!(!runs_in(&stat("S", 777), 1), "the parent is not the group");
        assert!(!runs_in(&stat("Z", 777), 777));
        assert!(!runs_in("garbage", 777));
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
        assert!(alive(id));
        // SAFETY: the group is the child's, made by `process_group(0)`.
        unsafe { libc::killpg(id, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(id) {
            assert!(Instant::now() < deadline, "the group did not end");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(leader.try_wait().is_err(), "reaped by `alive`");
    }
}
