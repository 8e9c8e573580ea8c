//! The process groups this proxy started: a command tool's call and a stdio
//! MCP server each run as the leader of a group of their own, so that a
//! signal reaches what they start in turn (`npx` starts `node`).
//!
//! A group is killed when its [`Group`] drops. The process's exit drops
//! nothing (pingora and the drain leave by `std::process::exit`), so at exit
//! each group still held is sent SIGTERM, given a moment to end, and killed:
//! a server still starting when the proxy stops no longer outlives it.

use std::sync::{Mutex, MutexGuard, Once, PoisonError};
use std::time::{Duration, Instant};

use libc::pid_t;

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

/// Whether a process's `/proc/<pid>/stat` says it runs in group `id`: its
/// state and group follow its name, which is in parentheses.
fn runs_in(stat: &str, id: pid_t) -> bool {
    let Some((_, after_name)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = after_name.split_ascii_whitespace();
    let state = fields.next();
    let group = fields.nth(1).and_then(|group| group.parse::<pid_t>().ok());
    state.is_some_and(|state| state != "Z" && state != "X") && group == Some(id)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    #[test]
    fn a_process_runs_in_its_group_until_it_is_a_zombie() {
        let stat = |state: &str| format!("4242 (node (a) b) {state} 4240 777 777 0 -1 4194560 0");
        assert!(runs_in(&stat("S"), 777));
        assert!(runs_in(&stat("R"), 777));
        assert!(!runs_in(&stat("S"), 4240), "the parent is not the group");
        assert!(!runs_in(&stat("Z"), 777));
        assert!(!runs_in("garbage", 777));
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
