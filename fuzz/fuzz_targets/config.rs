//! The config loader on any text: an error naming a key, never a panic.
#![no_main]

use agent_proxy::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Config::parse(text, |name| (name == "SET").then(|| "value".to_owned()));
});
