//! Test harness: a scripted fake upstream that speaks real HTTP/1.1 and SSE
//! framing, the real proxy binary on an ephemeral port, and a raw HTTP client
//! that records when each chunk arrived.
#![allow(dead_code, unused_imports)] // each test crate uses its own part of the harness

pub mod client;
pub mod fake;
pub mod mcp;
pub mod postgres;
pub mod proxy;
pub mod redis;
pub mod reload;
pub mod sdk;
pub mod weather;

pub use client::*;
pub use fake::*;
pub use mcp::*;
pub use postgres::*;
pub use proxy::*;
pub use redis::*;
pub use reload::*;
pub use sdk::*;
pub use weather::*;
