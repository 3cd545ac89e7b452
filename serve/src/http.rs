//! The REST front end (HTTP/1.1, axum): health, metadata, inference with
//! JSON tensors and the binary tensor data extension, and the model
//! repository extension. Every error is the protocol's `{"error": "..."}`.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::{Kind, Result, ServeError};
use crate::model::LoadedModel;
use crate::tensor::{self, DataType, InputData, InputTensor};
use crate::App;

/// The binary tensor data extension's header: length of the JSON part.
pub const HEADER_LEN: &str = "inference-header-content-length";

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, [("content-type", "application/json")], self.json()).into_response()
    }
}

fn json_response(v: Value) -> Response {
    (StatusCode::OK, [("content-type", "application/json")], v.to_string()).into_response()
}

/// The REST routes.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v2/health/live", get(|| async { json_response(json!({ "live": true })) }))
        .route("/v2/health/ready", get(health_ready))
        .route("/v2", get(server_metadata))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/versions/{version}", get(model_metadata_v))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route("/v2/models/{name}/versions/{version}/ready", get(model_ready_v))
        .route("/v2/models/{name}/infer", post(infer))
        .route("/v2/models/{name}/versions/{version}/infer", post(infer_v))
        .route("/v2/repository/index", post(repo_index))
        .route("/v2/repository/models/{name}/load", post(repo_load))
        .route("/v2/repository/models/{name}/unload", post(repo_unload))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
}

async fn not_found(method: Method, uri: Uri) -> Response {
    ServeError::not_found(format!("no endpoint {method} {}", uri.path())).into_response()
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let e = ServeError::bad(format!("method {method} is not allowed on {}", uri.path()));
    (StatusCode::METHOD_NOT_ALLOWED, [("content-type", "application/json")], e.json()).into_response()
}

async fn health_ready(State(app): State<Arc<App>>) -> Response {
    // The status is the answer; the body is what KServe's own server sends
    // and its client reads ({"ready": true}).
    if app.is_ready() {
        json_response(json!({ "ready": true }))
    } else {
        ServeError::new(Kind::NotReady, "the server is still loading its models").into_response()
    }
}

async fn server_metadata() -> Response {
    json_response(json!({ "name": crate::SERVER_NAME, "version": crate::SERVER_VERSION, "extensions": crate::EXTENSIONS }))
}

/// The protocol's model metadata object.
pub fn metadata_json(m: &LoadedModel) -> Value {
    json!({
        "name": m.name,
        "versions": [m.version.to_string()],
        "platform": "rbln",
        "inputs": m.spec.inputs.iter().map(|t| t.metadata_json()).collect::<Vec<_>>(),
        "outputs": m.spec.outputs.iter().map(|t| t.metadata_json()).collect::<Vec<_>>(),
    })
}

async fn model_metadata(State(app): State<Arc<App>>, Path(name): Path<String>) -> Response {
    match app.repo.get(&name, None) {
        Ok(m) => json_response(metadata_json(&m)),
        Err(e) => e.into_response(),
    }
}

async fn model_metadata_v(State(app): State<Arc<App>>, Path((name, version)): Path<(String, String)>) -> Response {
    match app.repo.get(&name, Some(&version)) {
        Ok(m) => json_response(metadata_json(&m)),
        Err(e) => e.into_response(),
    }
}

async fn model_ready(State(app): State<Arc<App>>, Path(name): Path<String>) -> Response {
    match app.repo.get(&name, None) {
        Ok(m) => json_response(json!({ "name": m.name, "ready": true })),
        Err(e) => e.into_response(),
    }
}

async fn model_ready_v(State(app): State<Arc<App>>, Path((name, version)): Path<(String, String)>) -> Response {
    match app.repo.get(&name, Some(&version)) {
        Ok(m) => json_response(json!({ "name": m.name, "ready": true })),
        Err(e) => e.into_response(),
    }
}

/// Bytes of an oversized body that are read and dropped before the 413
/// goes out, so that a client still writing its body reads the answer
/// instead of a reset connection.
const DRAIN_BYTES: u64 = 16 << 20;

/// Read the whole body, refusing more than `max` bytes.
async fn read_body(body: Body, headers: &HeaderMap, max: usize) -> Result<Bytes> {
    use http_body_util::BodyExt;
    let too_large = || ServeError::new(Kind::TooLarge, format!("the request body is larger than the server's limit of {max} bytes (--max-body-bytes)"));
    let declared = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|s| s.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max as u64 + DRAIN_BYTES) {
        return Err(too_large());
    }
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    let mut seen: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ServeError::bad(format!("cannot read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            seen += data.len() as u64;
            if seen > max as u64 {
                buf = bytes::BytesMut::new();
                if seen > max as u64 + DRAIN_BYTES {
                    break;
                }
            } else {
                buf.extend_from_slice(&data);
            }
        }
    }
    if seen > max as u64 {
        return Err(too_large());
    }
    Ok(buf.freeze())
}

#[derive(Deserialize)]
struct InferRequestJson {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Map<String, Value>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Vec<OutputJson>,
}

#[derive(Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// A boolean parameter (absent: None; present but not a boolean: error).
fn bool_param(params: &Map<String, Value>, key: &str, what: &str) -> Result<Option<bool>> {
    match params.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ServeError::bad(format!("{what}: parameter '{key}' must be a boolean, not {v}"))),
    }
}

/// A parsed inference request: the JSON part and the binary part.
pub struct ParsedRequest {
    pub id: Option<String>,
    inputs: Vec<InputJson>,
    /// Per input: its byte range in `binary`, if it has binary data.
    ranges: Vec<Option<std::ops::Range<usize>>>,
    binary: Bytes,
    /// (output name, binary_data) as requested.
    pub outputs: Vec<(String, Option<bool>)>,
    pub binary_output_default: bool,
}

impl ParsedRequest {
    /// Split a body into the JSON header and the binary data (the binary
    /// tensor data extension) and parse the JSON.
    pub fn parse(body: Bytes, header_len: Option<&HeaderValue>) -> Result<Self> {
        let (json_part, binary) = match header_len {
            None => (body.clone(), Bytes::new()),
            Some(v) => {
                let n: usize = v
                    .to_str()
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .ok_or_else(|| ServeError::bad(format!("header Inference-Header-Content-Length is not a byte count: {:?}", String::from_utf8_lossy(v.as_bytes()))))?;
                if n > body.len() {
                    return Err(ServeError::bad(format!("header Inference-Header-Content-Length is {n}, but the body has only {} bytes", body.len())));
                }
                (body.slice(..n), body.slice(n..))
            }
        };
        let req: InferRequestJson = serde_json::from_slice(&json_part).map_err(|e| ServeError::bad(format!("malformed inference request JSON: {e}")))?;
        let mut ranges = Vec::with_capacity(req.inputs.len());
        let mut at = 0usize;
        for inp in &req.inputs {
            let what = format!("input '{}'", inp.name);
            match inp.parameters.get("binary_data_size") {
                None => ranges.push(None),
                Some(v) => {
                    let size = v.as_u64().ok_or_else(|| ServeError::bad(format!("{what}: parameter 'binary_data_size' must be a non-negative integer, not {v}")))?;
                    if inp.data.is_some() {
                        return Err(ServeError::bad(format!("{what} has both 'data' and binary data (binary_data_size)")));
                    }
                    let end = usize::try_from(size).ok().and_then(|s| at.checked_add(s)).filter(|&e| e <= binary.len()).ok_or_else(|| {
                        ServeError::bad(format!(
                            "{what}: binary_data_size {size} goes past the end of the binary data ({} bytes after the {}-byte JSON header, {at} already used)",
                            binary.len(),
                            json_part.len()
                        ))
                    })?;
                    ranges.push(Some(at..end));
                    at = end;
                }
            }
        }
        if at != binary.len() {
            return Err(ServeError::bad(format!(
                "the body has {} bytes of binary data after the JSON header, but the inputs' binary_data_size add up to {at}",
                binary.len()
            )));
        }
        let binary_output_default = bool_param(&req.parameters, "binary_data_output", "request")?.unwrap_or(false);
        let mut outputs = Vec::with_capacity(req.outputs.len());
        for o in &req.outputs {
            outputs.push((o.name.clone(), bool_param(&o.parameters, "binary_data", &format!("output '{}'", o.name))?));
        }
        Ok(Self { id: req.id, inputs: req.inputs, ranges, binary, outputs, binary_output_default })
    }

    /// The inputs, borrowing their data from this request.
    pub fn input_tensors(&self) -> Vec<InputTensor<'_>> {
        self.inputs
            .iter()
            .zip(&self.ranges)
            .map(|(inp, range)| InputTensor {
                name: inp.name.clone(),
                datatype: inp.datatype.clone(),
                shape: inp.shape.clone(),
                data: match (range, &inp.data) {
                    (Some(r), _) => InputData::Raw(&self.binary[r.clone()]),
                    (None, Some(v)) => InputData::Json(v),
                    (None, None) => InputData::Missing,
                },
            })
            .collect()
    }
}

/// A response body: JSON alone, or JSON followed by binary outputs (with
/// the length of the JSON part for the Inference-Header-Content-Length header).
pub struct InferBody {
    pub json: Vec<u8>,
    pub binary: Vec<u8>,
}

/// Build the response of an inference.
pub fn build_response(m: &LoadedModel, id: Option<&str>, choices: &[tensor::OutputChoice], outs: &[rbln_runtime::Tensor]) -> InferBody {
    let mut binary = Vec::new();
    let mut outputs = Vec::with_capacity(choices.len());
    for c in choices {
        let t = &outs[c.index];
        let mut o = json!({
            "name": m.spec.outputs[c.index].name,
            "datatype": DataType::of(&t.data).name(),
            "shape": t.shape,
        });
        if c.binary {
            let bytes = tensor::raw_bytes(&t.data);
            o["parameters"] = json!({ "binary_data_size": bytes.len() });
            binary.extend_from_slice(&bytes);
        } else {
            o["data"] = tensor::json_data(&t.data);
        }
        outputs.push(o);
    }
    let mut body = json!({ "model_name": m.name, "model_version": m.version.to_string(), "outputs": outputs });
    if let Some(id) = id {
        body["id"] = Value::from(id);
    }
    InferBody { json: body.to_string().into_bytes(), binary }
}

async fn infer(State(app): State<Arc<App>>, Path(name): Path<String>, headers: HeaderMap, body: Body) -> Response {
    infer_common(app, name, None, headers, body).await
}

async fn infer_v(State(app): State<Arc<App>>, Path((name, version)): Path<(String, String)>, headers: HeaderMap, body: Body) -> Response {
    infer_common(app, name, Some(version), headers, body).await
}

async fn infer_common(app: Arc<App>, name: String, version: Option<String>, headers: HeaderMap, body: Body) -> Response {
    let _inflight = app.enter();
    let start = rbln_runtime::clock::now();
    let r = infer_inner(&app, &name, version.as_deref(), &headers, body).await;
    app.record(&name, "http", start, &r.as_ref().map(|_| ()));
    match r {
        Ok(b) if b.binary.is_empty() => (StatusCode::OK, [("content-type", "application/json")], b.json).into_response(),
        Ok(b) => {
            let json_len = b.json.len();
            let mut all = b.json;
            all.extend_from_slice(&b.binary);
            (StatusCode::OK, [("content-type", "application/octet-stream".to_string()), (HEADER_LEN, json_len.to_string())], all).into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn infer_inner(app: &App, name: &str, version: Option<&str>, headers: &HeaderMap, body: Body) -> Result<InferBody> {
    let model = app.repo.get(name, version)?;
    let bytes = read_body(body, headers, app.max_body).await?;
    let req = ParsedRequest::parse(bytes, headers.get(HEADER_LEN))?;
    let inputs = tensor::to_runtime_inputs(&model.spec, req.input_tensors())?;
    let choices = tensor::choose_outputs(&model.spec, &req.outputs, req.binary_output_default)?;
    let outs = crate::run_model(&model, inputs).await?;
    Ok(build_response(&model, req.id.as_deref(), &choices, &outs))
}

/// An optional JSON body of the repository calls ({} when empty).
fn optional_json(body: &Bytes, what: &str) -> Result<Map<String, Value>> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(v) => Err(ServeError::bad(format!("{what}: the body must be a JSON object, not {v}"))),
        Err(e) => Err(ServeError::bad(format!("{what}: malformed JSON: {e}"))),
    }
}

async fn repo_index(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = read_body(body, &headers, app.max_body).await?;
        let req = optional_json(&body, "repository index")?;
        let ready = bool_param(&req, "ready", "repository index")?.unwrap_or(false);
        let rows: Vec<Value> =
            app.repo.index(ready).into_iter().map(|e| json!({ "name": e.name, "version": e.version, "state": e.state, "reason": e.reason })).collect();
        Ok::<_, ServeError>(Value::Array(rows))
    }
    .await;
    match r {
        Ok(v) => json_response(v),
        Err(e) => e.into_response(),
    }
}

/// Parameters of a load/unload request: only `allowed` ones.
fn check_params(req: &Map<String, Value>, allowed: &[&str], what: &str) -> Result<()> {
    if let Some(p) = req.get("parameters") {
        let Value::Object(p) = p else {
            return Err(ServeError::bad(format!("{what}: 'parameters' must be an object")));
        };
        if let Some(k) = p.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ServeError::bad(format!("{what}: parameter '{k}' is not supported")));
        }
    }
    Ok(())
}

async fn repo_load(State(app): State<Arc<App>>, Path(name): Path<String>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = read_body(body, &headers, app.max_body).await?;
        let req = optional_json(&body, "load")?;
        check_params(&req, &[], &format!("load of model '{name}'"))?;
        let repo = app.repo.clone();
        let n = name.clone();
        tokio::task::spawn_blocking(move || repo.load(&n).map(|_| ())).await.map_err(|e| ServeError::internal(format!("load of model '{name}' failed: {e}")))?
    }
    .await;
    match r {
        Ok(()) => {
            eprintln!("rbln-serve: model '{name}' loaded (repository extension)");
            StatusCode::OK.into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn repo_unload(State(app): State<Arc<App>>, Path(name): Path<String>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = read_body(body, &headers, app.max_body).await?;
        let req = optional_json(&body, "unload")?;
        check_params(&req, &["unload_dependents"], &format!("unload of model '{name}'"))?;
        let repo = app.repo.clone();
        let n = name.clone();
        // Teardown (waiting for in-flight requests, freeing the device
        // memory) runs off the executor.
        tokio::task::spawn_blocking(move || repo.unload(&n).map(drop)).await.map_err(|e| ServeError::internal(format!("unload of model '{name}' failed: {e}")))?
    }
    .await;
    match r {
        Ok(()) => {
            eprintln!("rbln-serve: model '{name}' unloaded");
            StatusCode::OK.into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// The metrics endpoint's routes.
pub fn metrics_router(app: Arc<App>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(app): State<Arc<App>>| async move { ([("content-type", "text/plain; version=0.0.4")], app.repo.metrics.render()) }),
        )
        .with_state(app)
}
