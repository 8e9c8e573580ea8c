//! agent-proxy: a reverse proxy that turns any OpenAI-compatible LLM server
//! into an agent server.
//!
//! Follow a request top-down: [`service`] (the pingora hooks) routes it;
//! chat completions for an agent go through [`agent::rewrite`] and
//! [`agent::tool_loop`], which calls the [`upstream`] over [`http_client`],
//! parses its [`sse`] stream into [`openai`] types, runs [`tools`], and
//! answers the client through [`downstream`].

pub mod agent;
pub mod boxed;
pub mod children;
pub mod config;
pub mod conversation;
pub mod downstream;
pub mod error;
pub mod front;
pub mod http1;
pub mod http_client;
pub mod json;
pub mod knowledge;
pub mod limits;
pub mod logs;
pub mod mask;
pub mod mcp;
pub mod metrics;
pub mod openai;
pub mod per_thread;
pub mod reload;
pub mod request_id;
pub mod round;
pub mod service;
pub mod session;
pub mod shutdown;
pub mod socket;
pub mod sse;
pub mod store;
pub mod sync;
pub mod tools;
pub mod upstream;

/// `f`'s result on a thread of its own, which has kept nothing (history
/// entries, tool lists, strings read and held are each thread's): for tests of
/// what a thread keeps.
#[cfg(test)]
pub fn on_a_new_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f)
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
