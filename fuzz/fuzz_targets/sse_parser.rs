//! `checks/sse_parser.rs` under libFuzzer.
#![no_main]

#[path = "../checks/sse_parser.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
