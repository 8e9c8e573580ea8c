//! State that each thread writes in a part of its own, summed or merged where
//! it is read.
//!
//! A memory line that two cores write in turn moves from one core's cache to
//! the other's at each write: about 70 ns on the benchmark's machine
//! (`bench/results/ab.md`), where a whole passed-on request takes 5–6 µs of
//! user time. A process-wide counter, lock or reference count that every
//! request writes is such a line. Our runtimes are one a thread, like nginx's
//! workers: what a request writes on its way should be its thread's.

use std::sync::atomic::{AtomicUsize, Ordering};

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
        Self::from_fn(|_| part())
    }

    /// Its parts made by `part` from their numbers.
    pub fn from_fn(part: impl FnMut(usize) -> T) -> Self {
        PerThread {
            parts: (0..PARTS).map(part).map(CachePadded::new).collect(),
        }
    }

    /// Its parts made by `part`, unless one of them fails.
    pub fn try_new<E>(mut part: impl FnMut() -> Result<T, E>) -> Result<Self, E> {
        Ok(PerThread {
            parts: (0..PARTS)
                .map(|_| part().map(CachePadded::new))
                .collect::<Result<_, E>>()?,
        })
    }

    /// The calling thread's part.
    pub fn local(&self) -> &T {
        &self.parts[index()]
    }

    /// Part `index` (of [`PARTS`]), for a value made part for part from this.
    pub fn part(&self, index: usize) -> &T {
        &self.parts[index % PARTS]
    }

    /// Every part, for a reader that sums or merges them.
    pub fn parts(&self) -> impl Iterator<Item = &T> {
        self.parts.iter().map(|part| &**part)
    }
}

/// A count of things that live a while (requests in flight): each is counted
/// in the part of the thread it began on, and uncounted there, so no part
/// goes below zero and one in flight while the parts are read is seen.
pub struct Count(PerThread<AtomicUsize>);

/// Where a thing was counted.
#[must_use = "the part to lower"]
pub struct Counted(usize);

impl Count {
    pub fn new() -> Self {
        Count(PerThread::new(Default::default))
    }

    pub fn raise(&self) -> Counted {
        let part = index();
        self.0.parts[part].fetch_add(1, Ordering::Relaxed);
        Counted(part)
    }

    pub fn lower(&self, counted: Counted) {
        self.0.parts[counted.0].fetch_sub(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> usize {
        self.0
            .parts()
            .map(|part| part.load(Ordering::Relaxed))
            .sum()
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
    fn a_count_raised_on_one_thread_is_lowered_where_it_was_raised() {
        let count = std::sync::Arc::new(Count::new());
        let first = count.raise();
        let second = count.raise();
        assert_eq!(count.get(), 2);
        let other = count.clone();
        crate::on_a_new_thread(move || other.lower(first));
        assert_eq!(count.get(), 1);
        count.lower(second);
        assert_eq!(count.get(), 0);
    }

    #[test]
    fn a_thread_keeps_its_part() {
        let here = index();
        assert!(here < PARTS);
        assert_eq!(index(), here);
    }
}
