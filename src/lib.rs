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
pub mod mcp;
pub mod metrics;
pub mod openai;
pub mod reload;
pub mod request_id;
pub mod round;
pub mod service;
pub mod session;
pub mod shutdown;
pub mod socket;
pub mod sse;
pub mod store;
pub mod tools;
pub mod upstream;
