//! `checks/request_head.rs` under libFuzzer.
#![no_main]

#[path = "../checks/request_head.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
