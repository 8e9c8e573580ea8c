//! Locks on plain data.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`. A thread that panicked holding it left plain data (a
/// list, a state, a timestamp), still usable: the lock is not refused.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
