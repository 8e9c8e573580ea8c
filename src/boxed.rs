//! Futures boxed where they are built.
//!
//! `Box::pin(f())` builds `f`'s future on the stack, allocates, and then
//! copies it into the box whole, with the room its every state needs: a
//! request to one of our routes copied 15 KiB a request that way (its
//! hooks' future alone is 7.9 KiB). Allocating first lets the compiler
//! build the future in the box.

use std::future::Future;
use std::pin::Pin;

/// `Box::pin(make())`, with the future built in its box.
#[inline(always)]
pub fn pinned<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}
