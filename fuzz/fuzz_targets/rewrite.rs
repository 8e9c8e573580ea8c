//! `checks/rewrite.rs` under libFuzzer.
#![no_main]

#[path = "../checks/rewrite.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
