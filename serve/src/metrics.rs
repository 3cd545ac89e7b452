//! Prometheus metrics (`GET /metrics` on `--metrics-port`).

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

pub struct Metrics {
    registry: Registry,
    /// Inference requests by model, protocol and outcome.
    pub requests: IntCounterVec,
    /// Latency of successful inferences (request received → response built).
    pub latency: HistogramVec,
    /// Requests queued or running per model.
    pub queue_depth: IntGaugeVec,
    /// The bound of each model's queue.
    pub queue_capacity: IntGaugeVec,
    /// 1 while a model is loaded and ready.
    pub model_ready: IntGaugeVec,
    /// Rows per device run of a dynamically batched model.
    pub batch_rows: HistogramVec,
}

/// The model label for names that are not in the repository (so that
/// arbitrary names cannot grow the label set).
pub const UNKNOWN_MODEL: &str = "_unknown";

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("rbln_serve_requests_total", "Inference requests by model, protocol (http, grpc) and outcome"),
            &["model", "protocol", "outcome"],
        )
        .expect("valid metric");
        let buckets = vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
        let latency = HistogramVec::new(
            HistogramOpts::new("rbln_serve_request_duration_seconds", "Latency of successful inference requests").buckets(buckets),
            &["model", "protocol"],
        )
        .expect("valid metric");
        let queue_depth = IntGaugeVec::new(Opts::new("rbln_serve_queue_depth", "Requests queued or running on a model"), &["model"]).expect("valid metric");
        let queue_capacity =
            IntGaugeVec::new(Opts::new("rbln_serve_queue_capacity", "Requests a model accepts at once (max_queue)"), &["model"]).expect("valid metric");
        let model_ready = IntGaugeVec::new(Opts::new("rbln_serve_model_ready", "1 while the model is loaded and ready"), &["model"]).expect("valid metric");
        let batch_rows = HistogramVec::new(
            HistogramOpts::new("rbln_serve_batch_rows", "Rows (requests' batch sizes summed) per run of a dynamically batched model")
                .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]),
            &["model"],
        )
        .expect("valid metric");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency.clone()),
            Box::new(queue_depth.clone()),
            Box::new(queue_capacity.clone()),
            Box::new(model_ready.clone()),
            Box::new(batch_rows.clone()),
        ] {
            registry.register(c).expect("metric registered once");
        }
        Self { registry, requests, latency, queue_depth, queue_capacity, model_ready, batch_rows }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
