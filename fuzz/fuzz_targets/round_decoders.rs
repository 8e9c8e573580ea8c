//! `checks/round_decoders.rs` under libFuzzer.
#![no_main]

#[path = "../checks/round_decoders.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
