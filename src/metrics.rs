//! Prometheus metrics, served at `GET /metrics` (and on the admin listener
//! when one is configured). Labels are bounded: agent ids, tool and upstream
//! names come from the config (or the MCP servers it names), never from what
//! a client or a model sends.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    /// By route (`agent`, `chat`, `proxy`, `models`, …), agent, status, stream.
    pub requests: IntCounterVec,
    pub request_seconds: HistogramVec,
    pub first_token_seconds: HistogramVec,
    pub tool_calls: IntCounterVec,
    pub tool_seconds: HistogramVec,
    pub rounds: HistogramVec,
    pub upstream_errors: IntCounterVec,
    pub tokens: IntCounterVec,
    pub config_reloads: IntCounterVec,
    /// Response store failures by operation (`read`, `write`, `too_large`).
    pub store_errors: IntCounterVec,
    /// Agent requests by where their session id came from.
    pub sessions: SessionSources,
    /// Store calls by operation (`read`, `write`, `note_read`, `note_write`), as the store answered.
    pub store_seconds: HistogramVec,
    /// Knowledge searches by base and phase (`embed`: the query's
    /// embedding on the upstream; `search`: the index's scan).
    pub knowledge_seconds: HistogramVec,
    pub streams_in_flight: IntGauge,
}

/// `agent_proxy_sessions_total`'s two series, looked up once.
pub struct SessionSources {
    /// A header or body field named it.
    pub client: IntCounter,
    /// Derived from how the conversation begins.
    pub derived: IntCounter,
}

impl SessionSources {
    fn of(counter: &IntCounterVec) -> Self {
        SessionSources {
            client: counter.with_label_values(&["client"]),
            derived: counter.with_label_values(&["derived"]),
        }
    }
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A store call is a local file or a LAN round trip: finer at the bottom.
const STORE_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
];

impl Metrics {
    fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let c = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let histogram = |name: &str,
                         help: &str,
                         labels: &[&str],
                         buckets: &[f64]|
         -> Result<HistogramVec, prometheus::Error> {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )?;
            registry.register(Box::new(h.clone()))?;
            Ok(h)
        };
        let streams_in_flight = IntGauge::new(
            "agent_proxy_streams_in_flight",
            "Event streams being sent to clients",
        )?;
        registry.register(Box::new(streams_in_flight.clone()))?;
        Ok(Metrics {
            requests: counter(
                "agent_proxy_requests_total",
                "Requests by route, agent, status and stream",
                &["route", "agent", "status", "stream"],
            )?,
            request_seconds: histogram(
                "agent_proxy_request_duration_seconds",
                "Total time of a request",
                &["route"],
                LATENCY_BUCKETS,
            )?,
            first_token_seconds: histogram(
                "agent_proxy_time_to_first_token_seconds",
                "Time from the request to the first content or reasoning delta",
                &["agent"],
                LATENCY_BUCKETS,
            )?,
            tool_calls: counter(
                "agent_proxy_tool_calls_total",
                "Local tool calls by tool and outcome",
                &["tool", "outcome"],
            )?,
            tool_seconds: histogram(
                "agent_proxy_tool_duration_seconds",
                "Time a local tool call took",
                &["tool"],
                LATENCY_BUCKETS,
            )?,
            rounds: histogram(
                "agent_proxy_rounds",
                "Model calls per agent request",
                &["agent"],
                &[1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0],
            )?,
            upstream_errors: counter(
                "agent_proxy_upstream_errors_total",
                "Failed upstream attempts (retried or not) by upstream and kind",
                &["upstream", "kind"],
            )?,
            tokens: counter(
                "agent_proxy_tokens_total",
                "Tokens used by agent and kind (prompt, completion)",
                &["agent", "kind"],
            )?,
            config_reloads: counter(
                "agent_proxy_config_reloads_total",
                "Config reloads by result (ok, failed)",
                &["result"],
            )?,
            store_errors: counter(
                "agent_proxy_store_errors_total",
                "Store operations that failed (responses and memory notes), by operation",
                &["op"],
            )?,
            sessions: SessionSources::of(&counter(
                "agent_proxy_sessions_total",
                "Agent requests by the source of their session id (client: a header or body field; derived: from how the conversation begins)",
                &["source"],
            )?),
            store_seconds: histogram(
                "agent_proxy_store_duration_seconds",
                "Time a response store call took, by operation (a write: from the answer's end until it landed)",
                &["op"],
                STORE_BUCKETS,
            )?,
            knowledge_seconds: histogram(
                "agent_proxy_knowledge_search_duration_seconds",
                "Time a knowledge base search took, by base and phase (embed: the query's embedding; search: the index scan)",
                &["base", "phase"],
                STORE_BUCKETS,
            )?,
            streams_in_flight,
            registry,
        })
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8192);
        // Encoding our own registered metrics into a Vec does not fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }

    /// Counts a local call of `tool`. Only a tool the agent `offered` (a
    /// configured tool, an MCP tool the proxy listed, an agent) is a label of
    /// its own: any other name the model sends is counted as `other`, so a
    /// model cannot grow the label set.
    pub fn observe_tool(&self, tool: &str, offered: bool, ok: bool, took: Duration) {
        let tool = if offered { tool } else { "other" };
        let outcome = if ok { "ok" } else { "error" };
        self.tool_calls.with_label_values(&[tool, outcome]).inc();
        self.tool_seconds
            .with_label_values(&[tool])
            .observe(took.as_secs_f64());
    }

    /// `agent`'s own series.
    pub fn agent_series(&self, agent: &str) -> AgentSeries {
        AgentSeries {
            rounds: self.rounds.with_label_values(&[agent]),
            prompt_tokens: self.tokens.with_label_values(&[agent, "prompt"]),
            completion_tokens: self.tokens.with_label_values(&[agent, "completion"]),
            first_token_seconds: self.first_token_seconds.with_label_values(&[agent]),
        }
    }

    pub fn upstream_error(&self, upstream: &str, kind: &str) {
        self.upstream_errors
            .with_label_values(&[upstream, kind])
            .inc();
    }
}

/// An agent's series, looked up once when its config loads: a lookup by
/// labels hashes them under a lock, and an agent request made four.
#[derive(Clone)]
pub struct AgentSeries {
    pub rounds: Histogram,
    pub prompt_tokens: IntCounter,
    pub completion_tokens: IntCounter,
    pub first_token_seconds: Histogram,
}

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> =
        LazyLock::new(|| Metrics::new().expect("metric names and labels are valid"));
    &METRICS
}

/// Counts an event stream for as long as it lives.
pub struct StreamGuard(());

impl StreamGuard {
    pub fn open() -> Self {
        metrics().streams_in_flight.inc();
        StreamGuard(())
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        metrics().streams_in_flight.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_registered_families() {
        metrics().observe_tool("get_weather", true, true, Duration::from_millis(3));
        metrics().observe_tool("made_up", false, true, Duration::from_millis(3));
        let _guard = StreamGuard::open();
        let text = String::from_utf8(metrics().render()).unwrap();
        assert!(
            text.contains("agent_proxy_tool_calls_total{outcome=\"ok\",tool=\"get_weather\"} 1")
        );
        assert!(text.contains("agent_proxy_tool_calls_total{outcome=\"ok\",tool=\"other\"} 1"));
        assert!(!text.contains("made_up"));
        assert!(text.contains("agent_proxy_streams_in_flight 1"));
    }
}
