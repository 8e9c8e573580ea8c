//! Every seed of every fuzz target (`fuzz/corpus/<target>`: real llama.cpp
//! captures, client requests, the shipped configs, crashes found and fixed)
//! through that target's check, on every test run. The checks are the fuzz
//! targets' own (`fuzz/checks/`); the coverage-guided runs are done by hand
//! (fuzz/README.md).

use std::path::Path;

#[path = "../fuzz/checks/config.rs"]
mod config;
#[path = "../fuzz/checks/json_values.rs"]
mod json_values;
#[path = "../fuzz/checks/request_head.rs"]
mod request_head;
#[path = "../fuzz/checks/rewrite.rs"]
mod rewrite;
#[path = "../fuzz/checks/round_decoders.rs"]
mod round_decoders;
#[path = "../fuzz/checks/sse_parser.rs"]
mod sse_parser;
#[path = "../fuzz/checks/tool_calls.rs"]
mod tool_calls;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).expect("the target's corpus") {
        let path = entry.expect("a corpus entry").path();
        let data = std::fs::read(&path).expect("a seed");
        // A failing seed names itself before the check's own message.
        eprintln!("{target}: {}", path.display());
        check(&data);
        seeds += 1;
    }
    assert!(seeds > 0, "{target} has no seeds");
}

#[test]
fn sse_parser_seeds() {
    replay("sse_parser", sse_parser::check);
}

#[test]
fn tool_calls_seeds() {
    replay("tool_calls", tool_calls::check);
}

#[test]
fn rewrite_seeds() {
    replay("rewrite", rewrite::check);
}

#[test]
fn config_seeds() {
    replay("config", config::check);
}

#[test]
fn round_decoders_seeds() {
    replay("round_decoders", round_decoders::check);
}

#[test]
fn request_head_seeds() {
    replay("request_head", request_head::check);
}

#[test]
fn json_values_seeds() {
    replay("json_values", json_values::check);
}
