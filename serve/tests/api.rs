//! Host tests of rbln-serve's REST and gRPC front ends, driven in-process
//! (and over real sockets for the gRPC client and raw HTTP garbage), with
//! a stand-in backend instead of the NPU: model "addone" takes x FP32
//! [2, 3] and ids INT64 [2] (values 0..10) and returns y = x + 1 and
//! n = ids * 2. Model "slow" sleeps 300 ms per request on its own thread.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rbln_runtime::{Data, Tensor};
use rbln_serve::metrics::Metrics;
use rbln_serve::model::{Backend, Defaults, Job, Loader, ModelConfig};
use rbln_serve::repo::Repository;
use rbln_serve::tensor::{DataType, ModelSpec, TensorSpec};
use rbln_serve::App;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Fake {
    delay: Option<Duration>,
}

fn compute(inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
    let mut it = inputs.into_iter();
    let x = it.next().ok_or("no x")?;
    let ids = it.next().ok_or("no ids")?;
    // The model is compiled for 2 rows: a batched run is padded to them.
    if x.shape[0] != 2 || ids.shape[0] != 2 {
        return Err(format!("a run of {} rows", x.shape[0]));
    }
    let Data::F32(xv) = x.data else { return Err("x not f32".into()) };
    let Data::I64(iv) = ids.data else { return Err("ids not i64".into()) };
    Ok(vec![Tensor::new(&x.shape, xv.iter().map(|v| v + 1.0).collect::<Vec<f32>>()), Tensor::new(&ids.shape, iv.iter().map(|v| v * 2).collect::<Vec<i64>>())])
}

impl Backend for Fake {
    fn submit(&self, job: Job) {
        match self.delay {
            None => {
                let inputs = job.inputs.clone();
                job.answer(compute(inputs));
            }
            Some(d) => {
                std::thread::spawn(move || {
                    std::thread::sleep(d);
                    let inputs = job.inputs.clone();
                    job.answer(compute(inputs));
                });
            }
        }
    }
}

struct FakeLoader;

impl Loader for FakeLoader {
    fn load(&self, name: &str, path: &Path, _config: &ModelConfig) -> Result<(ModelSpec, Box<dyn Backend>), String> {
        let content = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        if content.starts_with("broken") {
            return Err("the file is not a model".into());
        }
        let spec = ModelSpec {
            inputs: vec![
                TensorSpec { name: "x".into(), datatype: DataType::Fp32, shape: vec![2, 3], range: None },
                TensorSpec { name: "ids".into(), datatype: DataType::Int64, shape: vec![2], range: Some((0, 10)) },
            ],
            outputs: vec![
                TensorSpec { name: "y".into(), datatype: DataType::Fp32, shape: vec![2, 3], range: None },
                TensorSpec { name: "n".into(), datatype: DataType::Int64, shape: vec![2], range: None },
            ],
            batching: None,
        };
        let delay = (name == "slow").then(|| Duration::from_millis(300));
        Ok((spec, Box::new(Fake { delay })))
    }
}

/// A repository in a fresh temporary directory.
fn repo_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("rbln-serve-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    for (name, versions) in [("addone", &[1u32, 3][..]), ("slow", &[1][..]), ("broken", &[1][..])] {
        for v in versions {
            let vd = d.join(name).join(v.to_string());
            std::fs::create_dir_all(&vd).unwrap();
            std::fs::write(vd.join("model.rbln"), if name == "broken" { "broken" } else { "fake" }).unwrap();
        }
    }
    std::fs::write(d.join("slow/config.json"), r#"{"instances": 1, "max_queue": 2, "timeout_ms": 5000}"#).unwrap();
    // A directory without versions is listed, never loaded.
    std::fs::create_dir_all(d.join("empty")).unwrap();
    d
}

fn app(tag: &str) -> Arc<App> {
    let repo = Repository::new(repo_dir(tag), Box::new(FakeLoader), Defaults { max_queue: 8, timeout_ms: 2000 }, Arc::new(Metrics::new()));
    let app = App::new(Arc::new(repo), 4096);
    app.repo.load_all();
    app.set_ready();
    app
}

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or_else(|| panic!("no error field: {}", String::from_utf8_lossy(&self.body))).to_string()
    }
}

async fn call(app: &Arc<App>, method: &str, uri: &str, headers: &[(&str, String)], body: Vec<u8>) -> Resp {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, v);
    }
    let resp = rbln_serve::http::router(app.clone()).oneshot(b.body(Body::from(body)).unwrap()).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec();
    Resp { status, headers, body }
}

async fn post_json(app: &Arc<App>, uri: &str, v: Value) -> Resp {
    call(app, "POST", uri, &[], v.to_string().into_bytes()).await
}

fn good_request() -> Value {
    json!({
        "id": "r1",
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6.5]},
            {"name": "ids", "shape": [2], "datatype": "INT64", "data": [3, 9]}
        ]
    })
}

async fn expect_error(app: &Arc<App>, req: Value, status: u16, needle: &str) {
    let r = post_json(app, "/v2/models/addone/infer", req.clone()).await;
    assert_eq!(r.status.as_u16(), status, "request {req}: body {}", String::from_utf8_lossy(&r.body));
    let e = r.error();
    assert!(e.contains(needle), "error {e:?} should contain {needle:?}");
}

#[tokio::test]
async fn health_and_metadata() {
    let app = app("meta");
    let live = call(&app, "GET", "/v2/health/live", &[], vec![]).await;
    assert_eq!((live.status, live.json()), (StatusCode::OK, json!({"live": true})));
    let ready = call(&app, "GET", "/v2/health/ready", &[], vec![]).await;
    assert_eq!((ready.status, ready.json()), (StatusCode::OK, json!({"ready": true})));
    let s = call(&app, "GET", "/v2", &[], vec![]).await.json();
    assert_eq!(s["name"], "rbln-serve");
    assert!(s["extensions"].as_array().unwrap().contains(&json!("binary_tensor_data")));
    let m = call(&app, "GET", "/v2/models/addone", &[], vec![]).await.json();
    assert_eq!(m["name"], "addone");
    assert_eq!(m["versions"], json!(["3"]), "the highest version is served");
    assert_eq!(m["inputs"][0], json!({"name": "x", "datatype": "FP32", "shape": [2, 3]}));
    assert_eq!(m["inputs"][1], json!({"name": "ids", "datatype": "INT64", "shape": [2]}));
    assert_eq!(m["outputs"][1]["datatype"], "INT64");
    assert_eq!(call(&app, "GET", "/v2/models/addone/versions/3", &[], vec![]).await.status, StatusCode::OK);
    let r = call(&app, "GET", "/v2/models/addone/versions/1", &[], vec![]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.error().contains("no version '1' loaded (serving version 3)"), "{}", r.error());
    assert_eq!(call(&app, "GET", "/v2/models/addone/ready", &[], vec![]).await.status, StatusCode::OK);
    let r = call(&app, "GET", "/v2/models/nosuch/ready", &[], vec![]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.error(), "unknown model 'nosuch'");
    // A model whose load failed is known but not ready, with the reason.
    let r = call(&app, "GET", "/v2/models/broken", &[], vec![]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.error().contains("the file is not a model"), "{}", r.error());
    let r = call(&app, "GET", "/v2/nothing/here", &[], vec![]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.error().contains("no endpoint GET /v2/nothing/here"));
}

#[tokio::test]
async fn infer_json_flat_and_nested() {
    let app = app("json");
    let r = post_json(&app, "/v2/models/addone/infer", good_request()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.headers.get("inference-header-content-length").is_none());
    let v = r.json();
    assert_eq!(v["model_name"], "addone");
    assert_eq!(v["model_version"], "3");
    assert_eq!(v["id"], "r1");
    assert_eq!(v["outputs"][0], json!({"name": "y", "datatype": "FP32", "shape": [2, 3], "data": [2.0, 3.0, 4.0, 5.0, 6.0, 7.5]}));
    assert_eq!(v["outputs"][1], json!({"name": "n", "datatype": "INT64", "shape": [2], "data": [6, 18]}));
    // Nested data, one requested output, a versioned URL.
    let req = json!({
        "inputs": [
            {"name": "ids", "shape": [2], "datatype": "INT64", "data": [[1], [2]]},
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[0, 0, 0], [1, 1, 1]]}
        ],
        "outputs": [{"name": "n"}]
    });
    let r = post_json(&app, "/v2/models/addone/versions/3/infer", req).await;
    assert_eq!(r.status, StatusCode::OK, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["outputs"].as_array().unwrap().len(), 1);
    assert_eq!(v["outputs"][0]["data"], json!([2, 4]));
    assert!(v.get("id").is_none());
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A binary-extension request body and its header length.
fn binary_body(header: Value, chunks: &[Vec<u8>]) -> (Vec<u8>, usize) {
    let mut body = header.to_string().into_bytes();
    let n = body.len();
    for c in chunks {
        body.extend_from_slice(c);
    }
    (body, n)
}

#[tokio::test]
async fn infer_binary_extension() {
    let app = app("binary");
    let x = [0.5f32, 1.5, 2.5, -1.0, -2.0, 3.25];
    let header = json!({
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}},
            {"name": "ids", "shape": [2], "datatype": "INT64", "parameters": {"binary_data_size": 16}}
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": true}}, {"name": "n", "parameters": {"binary_data": false}}]
    });
    let (body, n) = binary_body(header, &[f32_bytes(&x), i64_bytes(&[4, 5])]);
    let r = call(&app, "POST", "/v2/models/addone/infer", &[("Inference-Header-Content-Length", n.to_string())], body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", String::from_utf8_lossy(&r.body));
    let hl: usize = r.headers["inference-header-content-length"].to_str().unwrap().parse().unwrap();
    let v: Value = serde_json::from_slice(&r.body[..hl]).unwrap();
    assert_eq!(v["outputs"][0]["parameters"]["binary_data_size"], 24);
    assert!(v["outputs"][0].get("data").is_none());
    assert_eq!(v["outputs"][1]["data"], json!([8, 10]));
    let y: Vec<f32> = r.body[hl..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(y, x.iter().map(|v| v + 1.0).collect::<Vec<_>>());
    assert_eq!(r.body.len(), hl + 24);

    // binary_data_output for every output, JSON inputs.
    let mut req = good_request();
    req["parameters"] = json!({"binary_data_output": true});
    let r = post_json(&app, "/v2/models/addone/infer", req).await;
    let hl: usize = r.headers["inference-header-content-length"].to_str().unwrap().parse().unwrap();
    assert_eq!(r.body.len(), hl + 24 + 16);
    let n: Vec<i64> = r.body[hl + 24..].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(n, vec![6, 18]);
}

#[tokio::test]
async fn bad_inputs_name_what_is_wrong() {
    let app = app("bad");
    let mut r = good_request();
    r["inputs"][0]["datatype"] = json!("INT32");
    expect_error(&app, r, 400, "input 'x': datatype INT32 does not match the model's FP32").await;
    let mut r = good_request();
    r["inputs"][0]["datatype"] = json!("FP16");
    expect_error(&app, r, 400, "datatype FP16 is not supported").await;
    let mut r = good_request();
    r["inputs"][0]["datatype"] = json!("FLOAT");
    expect_error(&app, r, 400, "unknown datatype 'FLOAT'").await;
    let mut r = good_request();
    r["inputs"][0]["shape"] = json!([3, 2]);
    expect_error(&app, r, 400, "input 'x': shape [3, 2] does not match the model's [2, 3]").await;
    let mut r = good_request();
    r["inputs"][0]["name"] = json!("z");
    expect_error(&app, r, 400, "unexpected input 'z'").await;
    let mut r = good_request();
    r["inputs"].as_array_mut().unwrap().pop();
    expect_error(&app, r, 400, "missing input(s) [\"ids\"]").await;
    let mut r = good_request();
    r["inputs"][1] = r["inputs"][0].clone();
    expect_error(&app, r, 400, "input 'x' is given more than once").await;
    let mut r = good_request();
    r["inputs"][0]["data"] = json!([1, 2, 3]);
    expect_error(&app, r, 400, "input 'x': 'data' has 3 elements, but shape [2, 3] needs 6").await;
    let mut r = good_request();
    r["inputs"][0]["data"] = json!([1, 2, "three", 4, 5, 6]);
    expect_error(&app, r, 400, "input 'x': element 2 is \"three\", not a valid FP32 value").await;
    let mut r = good_request();
    r["inputs"][1]["data"] = json!([1.5, 2]);
    expect_error(&app, r, 400, "input 'ids': element 0 is 1.5, not a valid INT64 value").await;
    let mut r = good_request();
    r["inputs"][1]["data"] = json!([1, 10]);
    expect_error(&app, r, 400, "input 'ids': element 1 is 10, outside the range 0..10").await;
    let mut r = good_request();
    r["inputs"][0]["data"] = json!({"a": 1});
    expect_error(&app, r, 400, "'data' must be an array, not an object").await;
    let mut r = good_request();
    r["inputs"][0]["data"] = json!([[[[[1]]]], 2, 3, 4, 5, 6]);
    expect_error(&app, r, 400, "nested deeper").await;
    let mut r = good_request();
    r["inputs"][0].as_object_mut().unwrap().remove("data");
    expect_error(&app, r, 400, "input 'x' has no data").await;
    let mut r = good_request();
    r["outputs"] = json!([{"name": "q"}]);
    expect_error(&app, r, 400, "unknown output 'q' requested").await;
    let mut r = good_request();
    r["parameters"] = json!({"binary_data_output": "yes"});
    expect_error(&app, r, 400, "parameter 'binary_data_output' must be a boolean").await;
    let mut r = good_request();
    r["inputs"][0].as_object_mut().unwrap().remove("shape");
    expect_error(&app, r, 400, "malformed inference request JSON: missing field `shape`").await;

    // Malformed JSON.
    let r = call(&app, "POST", "/v2/models/addone/infer", &[], b"{\"inputs\": [".to_vec()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().starts_with("malformed inference request JSON: EOF while parsing"), "{}", r.error());
    // Unknown model.
    let r = post_json(&app, "/v2/models/nosuch/infer", good_request()).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.error(), "unknown model 'nosuch'");
    // Oversized body (limit 4096 in these tests).
    let r = call(&app, "POST", "/v2/models/addone/infer", &[], vec![b' '; 5000]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.error().contains("larger than the server's limit of 4096 bytes"), "{}", r.error());
}

#[tokio::test]
async fn bad_binary_sizes() {
    let app = app("badbin");
    let hdr = |xs: Value, ids: Value| {
        json!({"inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": xs}},
            {"name": "ids", "shape": [2], "datatype": "INT64", "parameters": {"binary_data_size": ids}}
        ]})
    };
    let post = |body: Vec<u8>, n: String| {
        let app = app.clone();
        async move { call(&app, "POST", "/v2/models/addone/infer", &[("Inference-Header-Content-Length", n)], body).await }
    };
    // Sizes match the body but not the shape.
    let (b, n) = binary_body(hdr(json!(20), json!(16)), &[vec![0; 20], vec![0; 16]]);
    let r = post(b, n.to_string()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().contains("input 'x': binary data has 20 bytes, but shape [2, 3] of FP32 needs 24"), "{}", r.error());
    // Sizes past the end of the body.
    let (b, n) = binary_body(hdr(json!(24), json!(16)), &[vec![0; 24], vec![0; 8]]);
    let r = post(b, n.to_string()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().contains("input 'ids': binary_data_size 16 goes past the end of the binary data"), "{}", r.error());
    // Bytes left over.
    let (b, n) = binary_body(hdr(json!(24), json!(16)), &[vec![0; 24], vec![0; 20]]);
    let r = post(b, n.to_string()).await;
    assert!(r.error().contains("44 bytes of binary data after the JSON header, but the inputs' binary_data_size add up to 40"), "{}", r.error());
    // Negative size, header length past the body, header not a number.
    let (b, n) = binary_body(hdr(json!(-1), json!(16)), &[]);
    assert!(post(b, n.to_string()).await.error().contains("'binary_data_size' must be a non-negative integer, not -1"));
    let (b, _) = binary_body(hdr(json!(24), json!(16)), &[vec![0; 40]]);
    let r = post(b, "100000".into()).await;
    assert!(r.error().contains("Inference-Header-Content-Length is 100000, but the body has only"), "{}", r.error());
    let (b, _) = binary_body(hdr(json!(24), json!(16)), &[vec![0; 40]]);
    assert!(post(b, "ten".into()).await.error().contains("Inference-Header-Content-Length is not a byte count"));
    // Header length that cuts the JSON.
    let (b, _) = binary_body(hdr(json!(24), json!(16)), &[vec![0; 40]]);
    assert!(post(b, "10".into()).await.error().starts_with("malformed inference request JSON"));
    // Bool bytes other than 0/1 would be caught too; both data and binary:
    let mut h = hdr(json!(24), json!(16));
    h["inputs"][0]["data"] = json!([1, 2, 3, 4, 5, 6]);
    let (b, n) = binary_body(h, &[vec![0; 40]]);
    assert!(post(b, n.to_string()).await.error().contains("input 'x' has both 'data' and binary data"));
    // The server still answers a good request.
    assert_eq!(post_json(&app, "/v2/models/addone/infer", good_request()).await.status, StatusCode::OK);
}

#[tokio::test]
async fn repository_index_load_unload() {
    let app = app("repo");
    let idx = post_json(&app, "/v2/repository/index", json!({})).await.json();
    let rows = idx.as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["addone", "broken", "empty", "slow"]);
    assert_eq!(rows[0]["state"], "READY");
    assert_eq!(rows[0]["version"], "3");
    assert_eq!(rows[1]["state"], "UNAVAILABLE");
    assert!(rows[1]["reason"].as_str().unwrap().contains("the file is not a model"));
    // An empty body is accepted; ready-only filter.
    let r = call(&app, "POST", "/v2/repository/index", &[], vec![]).await;
    assert_eq!(r.status, StatusCode::OK);
    let ready = post_json(&app, "/v2/repository/index", json!({"ready": true})).await.json();
    assert_eq!(ready.as_array().unwrap().len(), 2);

    let r = post_json(&app, "/v2/repository/models/addone/unload", json!({"parameters": {"unload_dependents": false}})).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = post_json(&app, "/v2/models/addone/infer", good_request()).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.error(), "model 'addone' is not ready: unloaded");
    assert_eq!(call(&app, "GET", "/v2/models/addone/ready", &[], vec![]).await.status, StatusCode::SERVICE_UNAVAILABLE);
    let r = call(&app, "POST", "/v2/repository/models/addone/load", &[], vec![]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(post_json(&app, "/v2/models/addone/infer", good_request()).await.status, StatusCode::OK);

    let r = post_json(&app, "/v2/repository/models/nosuch/load", json!({})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.error(), "model 'nosuch' is not in the model repository");
    let r = post_json(&app, "/v2/repository/models/..%2F..%2Fetc/load", json!({})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = post_json(&app, "/v2/repository/models/empty/load", json!({})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().contains("has no version directory"), "{}", r.error());
    let r = post_json(&app, "/v2/repository/models/broken/load", json!({})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().contains("model 'broken' version 1 failed to load: the file is not a model"), "{}", r.error());
    let r = post_json(&app, "/v2/repository/models/addone/load", json!({"parameters": {"config": "{}"}})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().contains("parameter 'config' is not supported"));
    let r = call(&app, "POST", "/v2/repository/models/addone/load", &[], b"[1]".to_vec()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = post_json(&app, "/v2/repository/models/nosuch/unload", json!({})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_bound_and_metrics() {
    let app = app("queue");
    // "slow": max_queue 2, 300 ms a request: of 4 at once, 2 are refused.
    let reqs = (0..4).map(|_| {
        let app = app.clone();
        tokio::spawn(async move { post_json(&app, "/v2/models/slow/infer", good_request()).await })
    }).collect::<Vec<_>>();
    let mut codes = Vec::new();
    for r in reqs {
        let r = r.await.unwrap();
        if r.status != StatusCode::OK {
            assert!(r.error().contains("model 'slow' is busy: its queue of 2 request(s) is full"), "{}", r.error());
        }
        codes.push(r.status.as_u16());
    }
    codes.sort();
    assert_eq!(codes, vec![200, 200, 503, 503]);
    let text = app.repo.metrics.render();
    assert!(text.contains(r#"rbln_serve_requests_total{model="slow",outcome="queue_full",protocol="http"} 2"#), "{text}");
    assert!(text.contains(r#"rbln_serve_requests_total{model="slow",outcome="success",protocol="http"} 2"#), "{text}");
    assert!(text.contains(r#"rbln_serve_request_duration_seconds_count{model="slow",protocol="http"} 2"#), "{text}");
    assert!(text.contains(r#"rbln_serve_queue_depth{model="slow"} 0"#), "{text}");
    assert!(text.contains(r#"rbln_serve_queue_capacity{model="slow"} 2"#), "{text}");
}

#[tokio::test]
async fn timeout() {
    let d = repo_dir("timeout");
    std::fs::write(d.join("slow/config.json"), r#"{"instances": 1, "timeout_ms": 50}"#).unwrap();
    let repo = Repository::new(d, Box::new(FakeLoader), Defaults { max_queue: 8, timeout_ms: 2000 }, Arc::new(Metrics::new()));
    let app = App::new(Arc::new(repo), 4096);
    app.repo.load_all();
    let r = post_json(&app, "/v2/models/slow/infer", good_request()).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(r.error(), "model 'slow': the request timed out after 50 ms");
}

/// A request of `rows` rows for "slow" served with batching: x = k, k+1, ...
fn batch_request(rows: usize, k: f32) -> Value {
    let x: Vec<f32> = (0..rows * 3).map(|i| k + i as f32).collect();
    let ids: Vec<i64> = (0..rows as i64).map(|i| (k as i64 + i) % 10).collect();
    json!({"inputs": [
        {"name": "x", "shape": [rows, 3], "datatype": "FP32", "data": x},
        {"name": "ids", "shape": [rows], "datatype": "INT64", "data": ids}
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_batching_gathers_requests_and_answers_each_its_rows() {
    let d = repo_dir("batch");
    // "slow" (300 ms a run, one at a time) compiled with 2 rows: batched.
    std::fs::write(d.join("slow/config.json"), r#"{"instances": 1, "max_queue": 16, "max_batch_size": 2}"#).unwrap();
    // "addone" asks for more rows than it was compiled for: not loaded.
    std::fs::write(d.join("addone/config.json"), r#"{"max_batch_size": 3}"#).unwrap();
    let repo = Repository::new(d, Box::new(FakeLoader), Defaults { max_queue: 8, timeout_ms: 5000 }, Arc::new(Metrics::new()));
    let app = App::new(Arc::new(repo), 4096);
    app.repo.load_all();
    let r = call(&app, "GET", "/v2/models/addone/ready", &[], vec![]).await;
    assert_ne!(r.status, StatusCode::OK);
    let r = post_json(&app, "/v2/repository/models/addone/load", json!({})).await;
    assert!(r.error().contains("max_batch_size 3: the model was compiled for batches of 2: max_batch_size must be 1 to 2"), "{}", r.error());
    // Metadata: the batch dimension is -1.
    let v = call(&app, "GET", "/v2/models/slow", &[], vec![]).await.json();
    assert_eq!(v["inputs"][0]["shape"], json!([-1, 3]));
    assert_eq!(v["outputs"][1]["shape"], json!([-1]));
    // Five single-row requests at once: one runs, the others queue and
    // go in twos (the fake refuses runs that are not padded to 2 rows).
    let reqs = (0..5).map(|k| {
        let app = app.clone();
        tokio::spawn(async move { (k, post_json(&app, "/v2/models/slow/infer", batch_request(1, 10.0 * k as f32)).await) })
    }).collect::<Vec<_>>();
    for r in reqs {
        let (k, r) = r.await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        let k = 10.0 * k as f32;
        assert_eq!(v["outputs"][0], json!({"name": "y", "datatype": "FP32", "shape": [1, 3], "data": [k + 1.0, k + 2.0, k + 3.0]}));
        assert_eq!(v["outputs"][1]["data"], json!([((k as i64) % 10) * 2]));
    }
    let text = app.repo.metrics.render();
    assert!(text.contains(r#"rbln_serve_batch_rows_count{model="slow"} 3"#), "{text}");
    assert!(text.contains(r#"rbln_serve_batch_rows_sum{model="slow"} 5"#), "{text}");
    // A request may carry up to max_batch_size rows, all inputs alike.
    let r = post_json(&app, "/v2/models/slow/infer", batch_request(2, 1.0)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["outputs"][0]["shape"], json!([2, 3]));
    expect_error_at(&app, "slow", batch_request(3, 1.0), 400, "input 'x': shape [3, 3] does not match the model's [-1, 3] (a batch of 1 to 2 rows)").await;
    let mut mixed = batch_request(2, 1.0);
    mixed["inputs"][1] = json!({"name": "ids", "shape": [1], "datatype": "INT64", "data": [1]});
    expect_error_at(&app, "slow", mixed, 400, "input 'ids' has 1 row(s) but input 'x' has 2: every input of a request must have the same batch size").await;
}

async fn expect_error_at(app: &Arc<App>, model: &str, req: Value, status: u16, needle: &str) {
    let r = post_json(app, &format!("/v2/models/{model}/infer"), req).await;
    assert_eq!(r.status.as_u16(), status, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.error().contains(needle), "{}", r.error());
}

#[test]
fn config_json_is_checked() {
    let d = std::env::temp_dir().join(format!("rbln-serve-test-{}-config", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("config.json"), r#"{"instances": 3}"#).unwrap();
    assert_eq!(ModelConfig::read(&d).unwrap_err(), "config.json: instances must be 1 or 2, not 3");
    std::fs::write(d.join("config.json"), r#"{"instanses": 1}"#).unwrap();
    assert!(ModelConfig::read(&d).unwrap_err().contains("unknown field `instanses`"));
    std::fs::write(d.join("config.json"), r#"{"instances": 1, "max_queue": 4, "timeout_ms": 100}"#).unwrap();
    let c = ModelConfig::read(&d).unwrap();
    assert_eq!((c.instances, c.max_queue, c.timeout_ms), (1, Some(4), Some(100)));
    std::fs::write(d.join("config.json"), r#"{"devices": []}"#).unwrap();
    assert_eq!(ModelConfig::read(&d).unwrap_err(), "config.json: devices must name at least one device");
    std::fs::write(d.join("config.json"), r#"{"devices": [1, 0, 1]}"#).unwrap();
    assert_eq!(ModelConfig::read(&d).unwrap_err(), "config.json: devices [1, 0, 1] names a device twice");
    std::fs::write(d.join("config.json"), r#"{"devices": [1, 0]}"#).unwrap();
    assert_eq!(ModelConfig::read(&d).unwrap().devices, Some(vec![1, 0]));
    std::fs::remove_file(d.join("config.json")).unwrap();
    assert_eq!(ModelConfig::read(&d).unwrap(), ModelConfig::default());
}

#[test]
fn error_mapping() {
    use rbln_serve::error::{Kind, ServeError};
    let cases = [
        (Kind::BadRequest, 400, tonic::Code::InvalidArgument),
        (Kind::NotFound, 404, tonic::Code::NotFound),
        (Kind::NotReady, 503, tonic::Code::Unavailable),
        (Kind::QueueFull, 503, tonic::Code::ResourceExhausted),
        (Kind::Timeout, 504, tonic::Code::DeadlineExceeded),
        (Kind::TooLarge, 413, tonic::Code::ResourceExhausted),
        (Kind::Internal, 500, tonic::Code::Internal),
    ];
    for (k, http, grpc) in cases {
        let e = ServeError::new(k, "what \"went\" wrong");
        assert_eq!(e.http_status(), http);
        assert_eq!(e.grpc_code(), grpc);
        assert_eq!(serde_json::from_str::<Value>(&e.json()).unwrap(), json!({"error": "what \"went\" wrong"}));
        let s: tonic::Status = e.into();
        assert_eq!(s.code(), grpc);
    }
}

/// Serve the REST and gRPC front ends on ephemeral ports.
async fn serve_sockets(app: Arc<App>) -> (std::net::SocketAddr, std::net::SocketAddr) {
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (ha, ga) = (http.local_addr().unwrap(), grpc.local_addr().unwrap());
    let router = rbln_serve::http::router(app.clone());
    tokio::spawn(async move { axum::serve(http, router).await });
    let svc = rbln_serve::grpc::service(app);
    tokio::spawn(async move {
        tonic::transport::Server::builder().add_service(svc).serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc)).await
    });
    (ha, ga)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_http_garbage_gets_400_and_the_server_survives() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = app("garbage");
    let (http, _) = serve_sockets(app).await;
    for garbage in [&b"GARBAGE\r\n\r\n"[..], b"GET / HTTP/9.9\r\n\r\n", b"\x00\x01\x02\xff\xfe\r\n\r\n", b"POST /v2/models/addone/infer HTTP/1.1\r\nContent-Length: -5\r\n\r\n"] {
        let mut s = tokio::net::TcpStream::connect(http).await.unwrap();
        s.write_all(garbage).await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
        let text = String::from_utf8_lossy(&buf);
        assert!(text.starts_with("HTTP/1.1 400"), "{garbage:?} -> {text:?}");
    }
    let mut s = tokio::net::TcpStream::connect(http).await.unwrap();
    s.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_infer_metadata_and_errors() {
    use rbln_serve::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
    use rbln_serve::pb::*;
    let app = app("grpc");
    let (_, grpc) = serve_sockets(app).await;
    let mut c = GrpcInferenceServiceClient::connect(format!("http://{grpc}")).await.unwrap();
    assert!(c.server_live(ServerLiveRequest {}).await.unwrap().into_inner().live);
    assert!(c.server_ready(ServerReadyRequest {}).await.unwrap().into_inner().ready);
    let md = c.model_metadata(ModelMetadataRequest { name: "addone".into(), version: String::new() }).await.unwrap().into_inner();
    assert_eq!(md.versions, vec!["3"]);
    assert_eq!(md.inputs[1].datatype, "INT64");
    assert_eq!(md.inputs[0].shape, vec![2, 3]);
    let s = c.model_metadata(ModelMetadataRequest { name: "nosuch".into(), version: String::new() }).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::NotFound);

    let input = |name: &str, dt: &str, shape: Vec<i64>, contents: Option<InferTensorContents>| model_infer_request::InferInputTensor {
        name: name.into(),
        datatype: dt.into(),
        shape,
        parameters: Default::default(),
        contents,
    };
    // Raw inputs.
    let req = ModelInferRequest {
        model_name: "addone".into(),
        id: "g1".into(),
        inputs: vec![input("x", "FP32", vec![2, 3], None), input("ids", "INT64", vec![2], None)],
        raw_input_contents: vec![f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).into(), i64_bytes(&[7, 8]).into()],
        ..Default::default()
    };
    let r = c.model_infer(req.clone()).await.unwrap().into_inner();
    assert_eq!(r.id, "g1");
    assert_eq!(r.model_version, "3");
    assert_eq!(r.outputs[0].name, "y");
    assert_eq!(r.outputs[0].datatype, "FP32");
    assert_eq!(r.outputs[0].shape, vec![2, 3]);
    assert_eq!(r.raw_output_contents[0], f32_bytes(&[2.0, 3.0, 4.0, 5.0, 6.0, 7.0]));
    assert_eq!(r.raw_output_contents[1], i64_bytes(&[14, 16]));
    // Typed contents.
    let typed = ModelInferRequest {
        model_name: "addone".into(),
        inputs: vec![
            input("x", "FP32", vec![2, 3], Some(InferTensorContents { fp32_contents: vec![0.0; 6], ..Default::default() })),
            input("ids", "INT64", vec![2], Some(InferTensorContents { int64_contents: vec![1, 2], ..Default::default() })),
        ],
        outputs: vec![model_infer_request::InferRequestedOutputTensor { name: "n".into(), parameters: Default::default() }],
        ..Default::default()
    };
    let r = c.model_infer(typed.clone()).await.unwrap().into_inner();
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(r.raw_output_contents.len(), 1);
    assert_eq!(r.raw_output_contents[0], i64_bytes(&[2, 4]));
    // Errors.
    let mut bad = req.clone();
    bad.inputs[0].datatype = "INT32".into();
    let s = c.model_infer(bad).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert_eq!(s.message(), "input 'x': datatype INT32 does not match the model's FP32");
    let mut bad = req.clone();
    bad.raw_input_contents[0].truncate(23);
    let s = c.model_infer(bad).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(s.message().contains("binary data has 23 bytes"), "{}", s.message());
    let mut bad = req.clone();
    bad.raw_input_contents.pop();
    let s = c.model_infer(bad).await.unwrap_err();
    assert!(s.message().contains("raw_input_contents has 1 entries for 2 inputs"), "{}", s.message());
    let mut bad = typed.clone();
    bad.inputs[1].contents = Some(InferTensorContents { int_contents: vec![1, 2], ..Default::default() });
    let s = c.model_infer(bad).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(s.message().contains("input 'ids': datatype INT64 cannot take contents.int_contents"), "{}", s.message());
    let mut bad = req.clone();
    bad.model_name = "nosuch".into();
    assert_eq!(c.model_infer(bad).await.unwrap_err().code(), tonic::Code::NotFound);
    let mut bad = req.clone();
    bad.inputs[1].shape = vec![3];
    assert_eq!(c.model_infer(bad).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    // Oversized message (limit 4096).
    let mut big = req.clone();
    big.raw_input_contents[0] = vec![0u8; 10_000].into();
    let s = c.model_infer(big).await.unwrap_err();
    // tonic's own message-size check.
    assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}");
    assert!(s.message().contains("decoded message length too large"), "{s:?}");

    // Queue bound: "slow" takes 2 at once.
    let mut slow = req.clone();
    slow.model_name = "slow".into();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let mut c = c.clone();
            let r = slow.clone();
            tokio::spawn(async move { c.model_infer(r).await.map(|_| ()).map_err(|s| s.code()) })
        })
        .collect();
    let mut exhausted = 0;
    for h in calls {
        if h.await.unwrap() == Err(tonic::Code::ResourceExhausted) {
            exhausted += 1;
        }
    }
    assert_eq!(exhausted, 2);

    // Repository.
    let idx = c.repository_index(RepositoryIndexRequest { ready: true, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(idx.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), vec!["addone", "slow"]);
    c.repository_model_unload(RepositoryModelUnloadRequest { model_name: "addone".into(), ..Default::default() }).await.unwrap();
    assert!(!c.model_ready(ModelReadyRequest { name: "addone".into(), version: String::new() }).await.unwrap().into_inner().ready);
    assert_eq!(c.model_infer(req.clone()).await.unwrap_err().code(), tonic::Code::Unavailable);
    c.repository_model_load(RepositoryModelLoadRequest { model_name: "addone".into(), ..Default::default() }).await.unwrap();
    assert!(c.model_ready(ModelReadyRequest { name: "addone".into(), version: String::new() }).await.unwrap().into_inner().ready);
    let s = c.repository_model_load(RepositoryModelLoadRequest { model_name: "nosuch".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::NotFound);
    assert!(c.model_infer(req).await.is_ok());
}

/// A backend that counts its jobs and answers after 200 ms.
struct Counting {
    jobs: Arc<std::sync::atomic::AtomicUsize>,
}

impl Backend for Counting {
    fn submit(&self, job: Job) {
        self.jobs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let inputs = job.inputs.clone();
            job.answer(compute(inputs));
        });
    }
}

struct SpreadLoader {
    counts: Vec<Arc<std::sync::atomic::AtomicUsize>>,
}

impl Loader for SpreadLoader {
    fn load(&self, name: &str, path: &Path, config: &ModelConfig) -> Result<(ModelSpec, Box<dyn Backend>), String> {
        let (spec, _) = FakeLoader.load(name, path, config)?;
        let backends = self.counts.iter().map(|c| Box::new(Counting { jobs: c.clone() }) as Box<dyn Backend>).collect();
        Ok((spec, Box::new(rbln_serve::model::Spread::new(backends))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_spread_over_devices() {
    let counts: Vec<_> = (0..2).map(|_| Arc::new(std::sync::atomic::AtomicUsize::new(0))).collect();
    let repo = Repository::new(repo_dir("spread"), Box::new(SpreadLoader { counts: counts.clone() }), Defaults { max_queue: 8, timeout_ms: 5000 }, Arc::new(Metrics::new()));
    let app = App::new(Arc::new(repo), 4096);
    app.repo.load_all();
    // 6 at once: the least-loaded device takes each, so 3 and 3.
    let reqs: Vec<_> = (0..6)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { post_json(&app, "/v2/models/addone/infer", good_request()).await.status })
        })
        .collect();
    for r in reqs {
        assert_eq!(r.await.unwrap(), StatusCode::OK);
    }
    let n: Vec<usize> = counts.iter().map(|c| c.load(std::sync::atomic::Ordering::SeqCst)).collect();
    assert_eq!(n, vec![3, 3]);
    assert_eq!(app.repo.get("addone", None).unwrap().pending(), 0);
}

/// A device whose health the test switches (a lost NPU: unhealthy).
struct Switchable {
    jobs: Arc<std::sync::atomic::AtomicUsize>,
    healthy: Arc<std::sync::atomic::AtomicBool>,
}

impl Backend for Switchable {
    fn submit(&self, job: Job) {
        self.jobs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let inputs = job.inputs.clone();
        job.answer(compute(inputs));
    }

    fn healthy(&self) -> bool {
        self.healthy.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct SwitchLoader {
    devices: Vec<(Arc<std::sync::atomic::AtomicUsize>, Arc<std::sync::atomic::AtomicBool>)>,
}

impl Loader for SwitchLoader {
    fn load(&self, name: &str, path: &Path, config: &ModelConfig) -> Result<(ModelSpec, Box<dyn Backend>), String> {
        let (spec, _) = FakeLoader.load(name, path, config)?;
        let backends = self.devices.iter().map(|(j, h)| Box::new(Switchable { jobs: j.clone(), healthy: h.clone() }) as Box<dyn Backend>).collect();
        Ok((spec, Box::new(rbln_serve::model::Spread::new(backends))))
    }
}

/// A lost device leaves the rotation: every request goes to the healthy
/// one. With none left, the model and the server are not ready and
/// requests get 503 saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_devices_leave_the_rotation() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let devices: Vec<_> = (0..2).map(|_| (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(true)))).collect();
    let repo = Repository::new(repo_dir("lost"), Box::new(SwitchLoader { devices: devices.clone() }), Defaults { max_queue: 8, timeout_ms: 5000 }, Arc::new(Metrics::new()));
    let app = App::new(Arc::new(repo), 4096);
    app.repo.load_all();
    app.set_ready();
    devices[1].1.store(false, SeqCst);
    for _ in 0..6 {
        assert_eq!(post_json(&app, "/v2/models/addone/infer", good_request()).await.status, StatusCode::OK);
    }
    assert_eq!((devices[0].0.load(SeqCst), devices[1].0.load(SeqCst)), (6, 0), "nothing went to the lost device");
    assert_eq!(call(&app, "GET", "/v2/health/ready", &[], vec![]).await.status, StatusCode::OK);
    devices[0].1.store(false, SeqCst);
    assert_eq!(call(&app, "GET", "/v2/models/addone/ready", &[], vec![]).await.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(call(&app, "GET", "/v2/health/ready", &[], vec![]).await.status, StatusCode::SERVICE_UNAVAILABLE);
    expect_error(&app, good_request(), 503, "every NPU it runs on is lost").await;
}
