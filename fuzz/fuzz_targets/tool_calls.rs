//! `checks/tool_calls.rs` under libFuzzer.
#![no_main]

#[path = "../checks/tool_calls.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
