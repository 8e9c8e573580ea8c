//! Log lines on their way to stderr: queued by the thread that logs them,
//! written by a thread of their own.
//!
//! The writer waits [`LINGER`] once woken, so the lines of that moment go
//! out in one `write(2)`. tracing-appender's writer, woken for every line,
//! cost a request at one connection 8–17 µs more CPU than this one
//! (58–67 against 48–50 µs; bench/results/ab.md).
//!
//! Each thread queues in a part of its own (`per_thread`): one queue for
//! all had every request on both cores take its lock and write its end.
//! Within a batch, a thread's lines keep their order; two threads' lines
//! of the same few milliseconds go out one thread's after the other's. A
//! part holds [`QUEUED_BYTES`] at most (its buffer twice that at most, and
//! 16 parts at most): past it, a line is dropped, and counted in a line of
//! its own once there is room, rather than a request kept waiting for a
//! stalled collector.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use crate::per_thread::PerThread;

/// How long the writer gathers lines once the first is queued.
const LINGER: Duration = Duration::from_millis(5);
/// The most a thread's part of the queue holds: a few times what a
/// thread logs at 60k requests a second in the writer's [`LINGER`].
const QUEUED_BYTES: usize = 256 << 10;

/// The process's queue.
static QUEUE: LazyLock<Queue> = LazyLock::new(|| Queue::new(QUEUED_BYTES));
/// The writer thread, once started.
static WRITER: OnceLock<Thread> = OnceLock::new();

/// Lines not yet written, each thread's in its part.
struct Queue {
    parts: PerThread<Mutex<Vec<u8>>>,
    /// Held while a batch is taken and written: batches reach stderr in
    /// the order they were taken, the last one at exit too.
    writing: Mutex<()>,
    dropped: AtomicU64,
    limit: usize,
}

impl Queue {
    fn new(limit: usize) -> Queue {
        Queue {
            parts: PerThread::new(|| Mutex::new(Vec::new())),
            writing: Mutex::new(()),
            dropped: AtomicU64::new(0),
            limit,
        }
    }

    /// Queues `line` in the thread's part (or drops it, the part full):
    /// whether it is the part's first of a batch, the writer to be woken.
    fn push(&self, line: &[u8]) -> bool {
        self.push_in(self.parts.local(), line)
    }

    fn push_in(&self, part: &Mutex<Vec<u8>>, line: &[u8]) -> bool {
        let Ok(mut lines) = part.lock() else {
            return false;
        };
        if lines.len() + line.len() > self.limit {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let first = lines.is_empty();
        lines.extend_from_slice(line);
        first
    }

    /// Writes what is queued to `out`, in one write; `batch` is the buffer
    /// it is taken into (kept for the next). The number of lines dropped
    /// since the last time.
    fn write_to(&self, out: &mut impl Write, batch: &mut Vec<u8>) -> u64 {
        match self.writing.lock() {
            Ok(_writing) => self.write_batch(out, batch),
            Err(_) => 0,
        }
    }

    /// [`Queue::write_to`], once `writing` is held. Each part is copied
    /// out, so that it keeps its room for its thread's next lines.
    fn write_batch(&self, out: &mut impl Write, batch: &mut Vec<u8>) -> u64 {
        for part in self.parts.parts() {
            if let Ok(mut lines) = part.lock() {
                batch.extend_from_slice(&lines);
                lines.clear();
            }
        }
        if !batch.is_empty() {
            // Nowhere to report stderr's own failure.
            let _ = out.write_all(batch).and_then(|()| out.flush());
            batch.clear();
            // A collector's stall filled it: its room goes with the stall.
            batch.shrink_to(self.limit);
        }
        self.dropped.swap(0, Ordering::Relaxed)
    }
}

/// Starts the writer thread and has what is queued at exit written.
pub(super) fn start() {
    let spawned = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(|| {
            let mut batch = Vec::new();
            loop {
                std::thread::park();
                std::thread::sleep(LINGER);
                let dropped = QUEUE.write_to(&mut std::io::stderr(), &mut batch);
                if dropped > 0 {
                    tracing::warn!(dropped, "log lines dropped: stderr did not keep up");
                }
            }
        });
    match spawned {
        Ok(handle) => {
            let _ = WRITER.set(handle.thread().clone());
            // SAFETY: registers a function of no arguments, which `exit` runs once.
            unsafe { libc::atexit(write_at_exit) };
        }
        // `Line` then writes each line itself.
        Err(e) => {
            eprintln!("cannot start the log writer's thread ({e}): lines go to stderr as logged")
        }
    }
}

/// Writes what is queued, after the batch being written, if any: waited
/// for a second at most (stderr may be a pipe nobody reads any more), so
/// that exiting never hangs.
extern "C" fn write_at_exit() {
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        if let Ok(_writing) = QUEUE.writing.try_lock() {
            QUEUE.write_batch(&mut std::io::stderr(), &mut Vec::new());
            return;
        }
        if std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// tracing-subscriber's writer for one line.
pub(super) struct Line;

impl Write for Line {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let Some(writer) = WRITER.get() else {
            return std::io::stderr().write(line);
        };
        if QUEUE.push(line) {
            writer.unpark();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_go_out_in_order_in_one_batch_and_a_full_queue_drops() {
        let queue = Queue::new(10);
        assert!(queue.push(b"one\n"), "the first line wakes the writer");
        assert!(!queue.push(b"two\n"), "the others wait with it");
        assert!(!queue.push(b"three\n"), "past the limit: dropped");
        let (mut out, mut batch) = (Vec::new(), Vec::new());
        assert_eq!(queue.write_to(&mut out, &mut batch), 1);
        assert_eq!(out, b"one\ntwo\n");
        // Emptied: the next line is a batch's first again, and nothing more
        // was dropped.
        assert!(queue.push(b"four\n"));
        assert_eq!(queue.write_to(&mut out, &mut batch), 0);
        assert_eq!(out, b"one\ntwo\nfour\n");
    }

    #[test]
    fn each_parts_lines_go_out_in_their_order_and_each_part_wakes_the_writer() {
        let queue = Queue::new(1 << 10);
        let (a, b) = (queue.parts.part(0), queue.parts.part(1));
        assert!(queue.push_in(a, b"a1\n"));
        assert!(
            queue.push_in(b, b"b1\n"),
            "another part's first line wakes it too"
        );
        assert!(!queue.push_in(b, b"b2\n"));
        assert!(!queue.push_in(a, b"a2\n"));
        let (mut out, mut batch) = (Vec::new(), Vec::new());
        queue.write_to(&mut out, &mut batch);
        let text = String::from_utf8(out).unwrap();
        let at = |line: &str| text.find(line).unwrap();
        assert_eq!(text.len(), 12, "{text}");
        assert!(at("a1") < at("a2") && at("b1") < at("b2"), "{text}");
        assert!(queue.push_in(b, b"b3\n"), "emptied: a batch's first again");
    }

    #[test]
    fn a_line_goes_in_its_threads_part_alone() {
        let queue = Queue::new(1 << 10);
        std::thread::scope(|scope| {
            scope.spawn(|| queue.push(b"line\n"));
        });
        let parts: Vec<usize> = queue
            .parts
            .parts()
            .map(|p| p.lock().unwrap().len())
            .collect();
        assert_eq!(parts.iter().sum::<usize>(), 5);
        assert_eq!(parts.iter().filter(|&&n| n > 0).count(), 1);
    }
}
