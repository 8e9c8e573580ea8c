//! State that each thread writes in a part of its own, summed or merged where
//! it is read.
//!
//! A memory line that two cores write in turn moves from one core's cache to
//! the other's at each write: 69–75 ns a hand-off on the benchmark's machine
//! (`bench/results/ab.md`), where a whole passed-on request takes 5–6 µs of
//! user time. A process-wide counter, lock or reference count that every
//! request writes is such a line. Without work stealing (the default) our
//! runtimes are one a thread, like nginx's workers: what a request writes on
//! its way should be its thread's.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crossbeam_utils::CachePadded;

/// Parts of each value: threads beyond it share parts (correct, if slower).
pub const PARTS: usize = 16;

/// This thread's part: threads are numbered as they first ask.
pub fn index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % PARTS;
    }
    INDEX.with(|index| *index)
}

/// A value in [`PARTS`] parts, each on cache lines of its own.
pub struct PerThread<T> {
    parts: Box<[CachePadded<T>]>,
}

impl<T> PerThread<T> {
    pub fn new(mut part: impl FnMut() -> T) -> Self {
        PerThread {
            parts: (0..PARTS).map(|_| CachePadded::new(part())).collect(),
        }
    }

    /// The calling thread's part.
    pub fn local(&self) -> &T {
        &self.parts[index()]
    }

    /// Part `index` (of [`PARTS`]).
    pub fn part(&self, index: usize) -> &T {
        &self.parts[index % PARTS]
    }

    /// Every part, for a reader that sums or merges them.
    pub fn parts(&self) -> impl Iterator<Item = &T> {
        self.parts.iter().map(|part| &**part)
    }
}

/// A value made part by part as threads first use it: only the threads that
/// write one pay its memory (a metric's series, say: 16 of each, most never
/// written, were 40 KiB an agent).
pub struct Lazy<T> {
    parts: PerThread<OnceLock<T>>,
    make: Box<dyn Fn(usize) -> T + Send + Sync>,
}

impl<T> Lazy<T> {
    /// `make` makes part `index`; part 0 is made now, so that a reader sees
    /// the value even before any thread wrote it.
    pub fn new(make: impl Fn(usize) -> T + Send + Sync + 'static) -> Self {
        let parts = PerThread::new(OnceLock::new);
        let _ = parts.part(0).set(make(0));
        Lazy {
            parts,
            make: Box::new(make),
        }
    }

    /// The calling thread's part.
    pub fn local(&self) -> &T {
        self.part(index())
    }

    /// Part `index`, made now if it was not.
    pub fn part(&self, index: usize) -> &T {
        self.parts
            .part(index)
            .get_or_init(|| (self.make)(index % PARTS))
    }

    /// The parts made so far.
    pub fn made(&self) -> impl Iterator<Item = &T> {
        self.parts.parts().filter_map(OnceLock::get)
    }
}

/// A count of things that live a while (requests in flight), in the parts of
/// the threads they begin and end on. Read as it is at one moment: every
/// part's ends first, then every part's beginnings (each only grows, and a
/// thing ends after it began): the same totals mean nothing was in flight
/// between the two reads.
pub struct Count(PerThread<Ends>);

#[derive(Default)]
struct Ends {
    began: AtomicU64,
    ended: AtomicU64,
}

impl Count {
    pub fn new() -> Self {
        Count(PerThread::new(Ends::default))
    }

    pub fn raise(&self) {
        // SeqCst: the reads' order above relies on it (on x86 a locked add
        // costs the same either way).
        self.0.local().began.fetch_add(1, Ordering::SeqCst);
    }

    pub fn lower(&self) {
        self.0.local().ended.fetch_add(1, Ordering::SeqCst);
    }

    /// How many are in flight, as of a moment during the call.
    pub fn get(&self) -> u64 {
        let ended: u64 = self.0.parts().map(|p| p.ended.load(Ordering::SeqCst)).sum();
        let began: u64 = self.0.parts().map(|p| p.began.load(Ordering::SeqCst)).sum();
        began - ended
    }
}

impl Default for Count {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_raised_on_one_thread_may_be_lowered_on_another() {
        let count = std::sync::Arc::new(Count::new());
        count.raise();
        count.raise();
        assert_eq!(count.get(), 2);
        let other = count.clone();
        crate::on_a_new_thread(move || other.lower());
        assert_eq!(count.get(), 1);
        count.lower();
        assert_eq!(count.get(), 0);
    }

    #[test]
    fn a_lazy_value_makes_a_part_when_a_thread_first_uses_it() {
        let lazy = std::sync::Arc::new(Lazy::new(|index| index));
        assert_eq!(lazy.made().count(), 1, "part 0, made up front");
        let here = *lazy.local();
        assert_eq!(here, index());
        let other = lazy.clone();
        let there = crate::on_a_new_thread(move || *other.local());
        // Each part made once, with its own number: 0, this thread's and
        // the other's (any of which may be the same part).
        let mut made: Vec<usize> = lazy.made().copied().collect();
        let mut expected = vec![0, here, there];
        expected.sort_unstable();
        expected.dedup();
        made.sort_unstable();
        assert_eq!(made, expected);
    }

    #[test]
    fn a_thread_keeps_its_part() {
        let here = index();
        assert!(here < PARTS);
        assert_eq!(index(), here);
    }
}
