//! `checks/json_values.rs` under libFuzzer.
#![no_main]

#[path = "../checks/json_values.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
