//! Prometheus metrics, served at `GET /metrics` (and on the admin listener
//! when one is configured). Labels are bounded: agent ids, tool and upstream
//! names come from the config (or the MCP servers it names), never from what
//! a client or a model sends.

use std::collections::btree_map::{BTreeMap, Entry};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Metric, MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

use crate::per_thread::Lazy;

/// The metrics that requests and streams write as they go are [`Split`]:
/// each thread counts in its own part (a count that both cores wrote at each
/// request moved its line between them, `per_thread`), and a scrape adds the
/// parts up. Those of failures and of rarer work are one for all threads.
pub struct Metrics {
    registry: Registry,
    /// By route (`agent`, `chat`, `proxy`, `models`, …), agent, status, stream.
    pub requests: Split<IntCounterVec>,
    pub request_seconds: Split<HistogramVec>,
    pub first_token_seconds: Split<HistogramVec>,
    pub tool_calls: Split<IntCounterVec>,
    pub tool_seconds: Split<HistogramVec>,
    pub rounds: Split<HistogramVec>,
    pub upstream_errors: IntCounterVec,
    pub tokens: Split<IntCounterVec>,
    pub config_reloads: IntCounterVec,
    /// Response store failures by operation (`read`, `write`, `too_large`).
    pub store_errors: IntCounterVec,
    /// Agent requests by where their session id came from.
    pub sessions: Lazy<SessionSources>,
    /// Store calls by operation (`read`, `write`, `note_read`, `note_write`), as the store answered.
    pub store_seconds: Split<HistogramVec>,
    /// Knowledge searches by base and phase (`embed`: the query's
    /// embedding on the upstream; `search`: the index's scan).
    pub knowledge_seconds: HistogramVec,
    pub streams_in_flight: Split<IntGauge>,
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

/// A metric kept in a part per thread that writes it ([`Lazy`]), registered
/// once: a scrape merges the parts' series, label set by label set
/// (counters and gauges add up, histograms bucket by bucket).
pub struct Split<M>(Arc<Lazy<M>>);

impl<M> Clone for Split<M> {
    fn clone(&self) -> Self {
        Split(self.0.clone())
    }
}

impl<M: Collector + Clone + 'static> Split<M> {
    fn register(
        registry: &Registry,
        make: impl Fn() -> prometheus::Result<M> + Send + Sync + 'static,
    ) -> prometheus::Result<Self> {
        // The first part checks the names and labels; the others, made of
        // the same, cannot fail, but would share the first's if they did.
        let first = make()?;
        let split = Split(Arc::new(Lazy::new(move |index| match index {
            0 => first.clone(),
            _ => make().unwrap_or_else(|_| first.clone()),
        })));
        registry.register(Box::new(split.clone()))?;
        Ok(split)
    }

    /// The calling thread's part.
    pub fn local(&self) -> &M {
        self.0.local()
    }

    /// Part `index`, for series looked up once in each part.
    fn part(&self, index: usize) -> &M {
        self.0.part(index)
    }
}

impl<M: Collector> Collector for Split<M> {
    fn desc(&self) -> Vec<&Desc> {
        // The parts are made alike: the first one describes them all.
        self.0.part(0).desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut parts = self.0.made().map(M::collect);
        let Some(mut families) = parts.next() else {
            return Vec::new();
        };
        for other in parts {
            for (family, other) in families.iter_mut().zip(other) {
                merge(family, other);
            }
        }
        families
    }
}

/// Adds `other`'s series into `family`'s, label set by label set.
fn merge(family: &mut MetricFamily, mut other: MetricFamily) {
    let kind = family.get_field_type();
    let mut by_labels: BTreeMap<Vec<(String, String)>, Metric> = family
        .take_metric()
        .into_iter()
        .map(|metric| (labels(&metric), metric))
        .collect();
    for metric in other.take_metric() {
        match by_labels.entry(labels(&metric)) {
            Entry::Vacant(entry) => {
                entry.insert(metric);
            }
            Entry::Occupied(mut entry) => add(kind, entry.get_mut(), &metric),
        }
    }
    family.set_metric(by_labels.into_values().collect());
}

fn labels(metric: &Metric) -> Vec<(String, String)> {
    metric
        .get_label()
        .iter()
        .map(|pair| (pair.name().to_owned(), pair.value().to_owned()))
        .collect()
}

fn add(kind: MetricType, into: &mut Metric, from: &Metric) {
    match kind {
        MetricType::COUNTER => {
            let mut counter = into.get_counter().clone();
            counter.set_value(counter.get_value() + from.get_counter().get_value());
            into.set_counter(counter);
        }
        MetricType::GAUGE => {
            let mut gauge = into.get_gauge().clone();
            gauge.set_value(gauge.get_value() + from.get_gauge().get_value());
            into.set_gauge(gauge);
        }
        MetricType::HISTOGRAM => {
            let (mut sum, other) = (into.get_histogram().clone(), from.get_histogram());
            sum.set_sample_count(sum.get_sample_count() + other.get_sample_count());
            sum.set_sample_sum(sum.get_sample_sum() + other.get_sample_sum());
            let mut buckets = sum.get_bucket().to_vec();
            for (bucket, more) in buckets.iter_mut().zip(other.get_bucket()) {
                bucket.set_cumulative_count(bucket.cumulative_count() + more.cumulative_count());
            }
            sum.set_bucket(buckets);
            into.set_histogram(sum);
        }
        // Summaries and untyped metrics: none of ours is split.
        _ => debug_assert!(false, "a split {kind:?} metric"),
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
        let registry = &registry;
        let new_counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = new_counter(name, help, labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let split_counter =
            |name: &'static str, help: &'static str, labels: &'static [&'static str]| {
                Split::register(registry, move || new_counter(name, help, labels))
            };
        let new_histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            let h = new_histogram(name, help, labels, buckets)?;
            registry.register(Box::new(h.clone()))?;
            Ok::<_, prometheus::Error>(h)
        };
        let split_histogram = |name: &'static str,
                               help: &'static str,
                               labels: &'static [&'static str],
                               buckets: &'static [f64]| {
            Split::register(registry, move || new_histogram(name, help, labels, buckets))
        };
        let streams_in_flight = Split::register(registry, || {
            IntGauge::new(
                "agent_proxy_streams_in_flight",
                "Event streams being sent to clients",
            )
        })?;
        let sessions = split_counter(
            "agent_proxy_sessions_total",
            "Agent requests by the source of their session id (client: a header or body field; derived: from how the conversation begins)",
            &["source"],
        )?;
        Ok(Metrics {
            requests: split_counter(
                "agent_proxy_requests_total",
                "Requests by route, agent, status and stream",
                &["route", "agent", "status", "stream"],
            )?,
            request_seconds: split_histogram(
                "agent_proxy_request_duration_seconds",
                "Total time of a request",
                &["route"],
                LATENCY_BUCKETS,
            )?,
            first_token_seconds: split_histogram(
                "agent_proxy_time_to_first_token_seconds",
                "Time from the request to the first content or reasoning delta",
                &["agent"],
                LATENCY_BUCKETS,
            )?,
            tool_calls: split_counter(
                "agent_proxy_tool_calls_total",
                "Local tool calls by tool and outcome",
                &["tool", "outcome"],
            )?,
            tool_seconds: split_histogram(
                "agent_proxy_tool_duration_seconds",
                "Time a local tool call took",
                &["tool"],
                LATENCY_BUCKETS,
            )?,
            rounds: split_histogram(
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
            tokens: split_counter(
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
            sessions: Lazy::new(move |i| SessionSources::of(sessions.part(i))),
            store_seconds: split_histogram(
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
            registry: registry.clone(),
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
        self.tool_calls
            .local()
            .with_label_values(&[tool, outcome])
            .inc();
        self.tool_seconds
            .local()
            .with_label_values(&[tool])
            .observe(took.as_secs_f64());
    }

    /// `agent`'s own series.
    pub fn agent_series(&'static self, agent: &str) -> AgentSeries {
        let agent = agent.to_owned();
        AgentSeries(Arc::new(Lazy::new(move |i| Series {
            rounds: self.rounds.part(i).with_label_values(&[&agent]),
            prompt_tokens: self.tokens.part(i).with_label_values(&[&agent, "prompt"]),
            completion_tokens: self
                .tokens
                .part(i)
                .with_label_values(&[&agent, "completion"]),
            first_token_seconds: self
                .first_token_seconds
                .part(i)
                .with_label_values(&[&agent]),
        })))
    }

    pub fn upstream_error(&self, upstream: &str, kind: &str) {
        self.upstream_errors
            .with_label_values(&[upstream, kind])
            .inc();
    }
}

/// An agent's series, looked up once when its config loads (a lookup by
/// labels hashes them under a lock, and an agent request made four), in each
/// thread's part.
#[derive(Clone)]
pub struct AgentSeries(Arc<Lazy<Series>>);

impl AgentSeries {
    /// The calling thread's part.
    pub fn local(&self) -> &Series {
        self.0.local()
    }
}

/// An agent's series in one thread's part.
pub struct Series {
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
        metrics().streams_in_flight.local().inc();
        StreamGuard(())
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        metrics().streams_in_flight.local().dec();
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

    #[test]
    fn a_split_metric_is_scraped_as_the_sum_of_its_parts() {
        let registry = Registry::new();
        let counter = Split::register(&registry, || {
            IntCounterVec::new(Opts::new("t_total", "t"), &["k"])
        })
        .unwrap();
        let histogram = Split::register(&registry, || {
            HistogramVec::new(
                HistogramOpts::new("t_seconds", "t").buckets(vec![0.1, 1.0]),
                &["k"],
            )
        })
        .unwrap();
        let open = Split::register(&registry, || IntGauge::new("t_open", "t")).unwrap();
        counter.part(0).with_label_values(&["a"]).inc();
        counter.part(1).with_label_values(&["a"]).inc_by(2);
        counter.part(2).with_label_values(&["b"]).inc();
        histogram.part(0).with_label_values(&["a"]).observe(0.05);
        histogram.part(5).with_label_values(&["a"]).observe(0.5);
        // A stream opened on one thread and closed on another, and one open.
        open.part(3).inc();
        open.part(4).dec();
        open.part(4).inc();
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        for line in [
            "t_total{k=\"a\"} 3\n",
            "t_total{k=\"b\"} 1\n",
            "t_seconds_bucket{k=\"a\",le=\"0.1\"} 1\n",
            "t_seconds_bucket{k=\"a\",le=\"1\"} 2\n",
            "t_seconds_bucket{k=\"a\",le=\"+Inf\"} 2\n",
            "t_seconds_sum{k=\"a\"} 0.55\n",
            "t_seconds_count{k=\"a\"} 2\n",
            "t_open 1\n",
        ] {
            assert!(text.contains(line), "{line:?} in {text}");
        }
        assert_eq!(text.matches("# TYPE t_total counter").count(), 1);
    }
}
