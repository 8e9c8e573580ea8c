//! The config loader on any text: an error naming a key, never a panic.
//!
//! Shared by the fuzz target and by `tests/fuzz_seeds.rs`, which replays
//! the seed corpus on every test run.

use agent_proxy::config::Config;

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Config::parse(text, |name| (name == "SET").then(|| "value".to_owned()));
}
