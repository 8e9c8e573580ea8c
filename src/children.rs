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

/// Whether a process of group `id` is alive. Its ended processes that are
/// our children are reaped first: a zombie still counts as a member.
fn alive(id: pid_t) -> bool {
    // SAFETY: waitpid with a null status pointer and kill with signal 0 have
    // no memory-safety preconditions.
    unsafe {
        while libc::waitpid(-id, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
        libc::kill(-id, 0) == 0
    }
}
