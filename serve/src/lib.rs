//! `rbln-serve`: the Open Inference Protocol (KServe v2) for models on
//! the rbln NPU, over HTTP/REST ([`http`]) and gRPC ([`grpc`]), with
//! Prometheus metrics ([`metrics`]). See docs/serve.md.

pub mod batch;
pub mod error;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod model;
pub mod repo;
pub mod tensor;

/// The protocol's messages and service, generated from
/// proto/grpc_service.proto.
pub mod pb {
    #![allow(clippy::all)]
    tonic::include_proto!("inference");
}

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use error::{Result, ServeError};
use model::LoadedModel;
use rbln_runtime::Tensor;

pub const SERVER_NAME: &str = "rbln-serve";
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Protocol extensions this server implements.
pub const EXTENSIONS: &[&str] = &["binary_tensor_data", "model_repository"];

/// What the REST and gRPC front ends share.
pub struct App {
    pub repo: Arc<repo::Repository>,
    /// Largest request body (REST) or message (gRPC) accepted.
    pub max_body: usize,
    /// Set once the models of the repository were loaded at start.
    pub ready: AtomicBool,
    /// Inference requests being handled (REST and gRPC).
    pub inflight: AtomicUsize,
}

/// Counts one inference request in [`App::inflight`] while it lives.
pub struct InflightGuard<'a>(&'a AtomicUsize);

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl App {
    pub fn new(repo: Arc<repo::Repository>, max_body: usize) -> Arc<Self> {
        Arc::new(Self { repo, max_body, ready: AtomicBool::new(false), inflight: AtomicUsize::new(0) })
    }

    /// Count an inference request until the guard drops.
    pub fn enter(&self) -> InflightGuard<'_> {
        self.inflight.fetch_add(1, Ordering::AcqRel);
        InflightGuard(&self.inflight)
    }

    /// Loaded, and no model has lost all its NPUs.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && self.repo.all_healthy()
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// The metric label for a model name.
    pub fn model_label<'a>(&self, name: &'a str) -> &'a str {
        if self.repo.is_known(name) {
            name
        } else {
            metrics::UNKNOWN_MODEL
        }
    }

    /// Count one inference request and, if it succeeded, its latency.
    pub fn record(&self, model: &str, protocol: &str, start: rbln_runtime::clock::Stamp, r: &std::result::Result<(), &ServeError>) {
        let label = self.model_label(model);
        let m = &self.repo.metrics;
        match r {
            Ok(()) => {
                m.requests.with_label_values(&[label, protocol, "success"]).inc();
                m.latency.with_label_values(&[label, protocol]).observe(start.elapsed().as_secs_f64());
            }
            Err(e) => m.requests.with_label_values(&[label, protocol, e.outcome()]).inc(),
        }
    }
}

/// Run checked inputs on a model and check what came back.
pub async fn run_model(model: &LoadedModel, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
    let outs = model.infer(inputs).await?;
    if outs.len() != model.spec.outputs.len() {
        return Err(ServeError::internal(format!("model '{}' returned {} outputs, its signature has {}", model.name, outs.len(), model.spec.outputs.len())));
    }
    Ok(outs)
}
