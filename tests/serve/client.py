"""Drive a running rbln-serve with the real Open Inference Protocol clients
(tritonclient HTTP and gRPC) and with raw HTTP, and check every answer.

    python3 tests/serve/client.py HTTP_PORT GRPC_PORT METRICS_PORT

The server (tests/vm/serve.sh) serves the repository that suite builds:
mlp (versions 1 and 2), cnn (1 instance, queue 1), bert-ids (two INT64
inputs), yolo-timeout (timeout_ms 2), unet (1 instance, queue 1) and
broken (a truncated file). Prints "ok - ..." per check; exits 1 at the
first failure.
"""

import http.client
import json
import socket
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from checks import check

HTTP, GRPC, METRICS = (int(p) for p in sys.argv[1:4])
HOST = "127.0.0.1"
M = "target/models"
O = "target/onnx"


def expect_error(desc, fn, status, needle):
    """fn must raise InferenceServerException with this status and a message containing needle."""
    try:
        fn()
    except InferenceServerException as e:
        check(f"{desc}: {status} '{needle}'", e.status() == status and needle in e.message(), f"(got {e.status()} {e.message()!r})")
        return
    check(desc, False, "(no error raised)")


def raw(method, path, body=b"", headers=None):
    """One HTTP request on a fresh connection: (status, body bytes, headers)."""
    c = http.client.HTTPConnection(HOST, HTTP, timeout=60)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, dict(r.getheaders())


def raw_error(desc, method, path, body, status, needle, headers=None):
    st, data, _ = raw(method, path, body, headers)
    try:
        msg = json.loads(data)["error"]
    except Exception as e:  # noqa: BLE001 (report what came back)
        check(desc, False, f"(status {st}, body not the error JSON: {data[:200]!r}: {e})")
        return
    check(f"{desc}: {status} '{needle}'", st == status and needle in msg, f"(got {st} {msg!r})")


x = np.load(f"{M}/mlp.input.npy")
y_ref = np.load(f"{M}/mlp.expected.npy")
cnn_x = np.load(f"{M}/cnn.input.npy")
ids = np.load(f"{O}/bert-ids.input0.npy")
mask = np.load(f"{O}/bert-ids.input1.npy")
bert_ref = np.load(f"{O}/bert-ids.expected.npy")

# ---- HTTP (tritonclient.http) ----
h = httpclient.InferenceServerClient(f"{HOST}:{HTTP}", network_timeout=120)
check("HTTP: server live", h.is_server_live())
check("HTTP: server ready", h.is_server_ready())
md = h.get_server_metadata()
check("HTTP: server metadata names rbln-serve and its extensions", md["name"] == "rbln-serve" and "binary_tensor_data" in md["extensions"] and "model_repository" in md["extensions"], md)
mm = h.get_model_metadata("mlp")
check(
    "HTTP: mlp metadata (highest version, FP32 [16, 256] -> [16, 10])",
    mm["versions"] == ["2"] and mm["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [16, 256]}] and mm["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [16, 10]}],
    mm,
)
check("HTTP: bert-ids metadata has two INT64 inputs", [(i["name"], i["datatype"]) for i in h.get_model_metadata("bert-ids")["inputs"]] == [("input_ids", "INT64"), ("attention_mask", "INT64")])
check("HTTP: model ready (mlp, version 2)", h.is_model_ready("mlp") and h.is_model_ready("mlp", "2"))
check("HTTP: broken model is not ready", not h.is_model_ready("broken"))


def http_infer(model, arrays, binary_in=True, binary_out=True, outputs=None):
    ins = []
    for name, a in arrays:
        i = httpclient.InferInput(name, list(a.shape), {"float32": "FP32", "int64": "INT64", "int32": "INT32", "bool": "BOOL"}[str(a.dtype)])
        i.set_data_from_numpy(a, binary_data=binary_in)
        ins.append(i)
    outs = [httpclient.InferRequestedOutput(o, binary_data=binary_out) for o in outputs] if outputs else None
    return h.infer(model, ins, outputs=outs)


r = http_infer("mlp", [("x", x)])
check("HTTP infer, binary tensors: mlp matches its reference", np.allclose(r.as_numpy("y"), y_ref, atol=1e-4), np.abs(r.as_numpy("y") - y_ref).max())
r = http_infer("mlp", [("x", x)], binary_in=False, binary_out=False, outputs=["y"])
resp = r.get_response()
check("HTTP infer, JSON tensors: mlp matches its reference", "data" in resp["outputs"][0] and np.allclose(r.as_numpy("y"), y_ref, atol=1e-4))
check("HTTP infer response names model and version", resp["model_name"] == "mlp" and resp["model_version"] == "2", resp.get("model_version"))
r = http_infer("bert-ids", [("input_ids", ids), ("attention_mask", mask)])
check("HTTP infer, INT64 inputs: bert-ids matches its reference", np.allclose(r.as_numpy("last_hidden_state"), bert_ref, atol=1e-3))
def mlp_input():
    i = httpclient.InferInput("x", [16, 256], "FP32")
    i.set_data_from_numpy(x)
    return [i]


expect_error("HTTP infer: a version that is not served", lambda: h.infer("mlp", mlp_input(), model_version="1"), "404", "model 'mlp' has no version '1' loaded (serving version 2)")
# Nested JSON data (raw request).
st, data, _ = raw("POST", "/v2/models/mlp/infer", json.dumps({"inputs": [{"name": "x", "shape": [16, 256], "datatype": "FP32", "data": x.tolist()}]}).encode())
check("raw HTTP: nested JSON data accepted and matches", st == 200 and np.allclose(np.array(json.loads(data)["outputs"][0]["data"]).reshape(16, 10), y_ref, atol=1e-4), st)

# ---- bad input through tritonclient.http ----
def bad(name, shape, dtype, arr, model="mlp"):
    i = httpclient.InferInput(name, shape, dtype)
    i.set_data_from_numpy(arr)
    return lambda: h.infer(model, [i])


expect_error("HTTP: wrong datatype", bad("x", [16, 256], "INT32", x.astype(np.int32)), "400", "input 'x': datatype INT32 does not match the model's FP32")
expect_error("HTTP: wrong shape", bad("x", [4, 256], "FP32", x[:4]), "400", "input 'x': shape [4, 256] does not match the model's [16, 256]")
expect_error("HTTP: wrong input name", bad("z", [16, 256], "FP32", x), "400", "unexpected input 'z': the model's inputs are [\"x\"]")
expect_error("HTTP: unknown model", bad("x", [16, 256], "FP32", x, model="nosuch"), "404", "unknown model 'nosuch'")
expect_error("HTTP: id out of the model's range", bad("input_ids", [2, 16], "INT64", np.full((2, 16), 500, np.int64), model="bert-ids"), "400", "outside the range -100..100")
expect_error(
    "HTTP: unknown output",
    lambda: h.infer("mlp", mlp_input(), outputs=[httpclient.InferRequestedOutput("q")]),
    "400",
    "unknown output 'q' requested",
)

# ---- bad input as raw HTTP ----
good_json = {"inputs": [{"name": "x", "shape": [16, 256], "datatype": "FP32", "data": x.ravel().tolist()}]}
raw_error("raw HTTP: malformed JSON", "POST", "/v2/models/mlp/infer", b'{"inputs": [{"name": "x",', 400, "malformed inference request JSON")
raw_error("raw HTTP: JSON of the wrong form", "POST", "/v2/models/mlp/infer", b'{"inputs": 5}', 400, "malformed inference request JSON: invalid type: integer `5`, expected a sequence")
bad_count = json.loads(json.dumps(good_json))
bad_count["inputs"][0]["data"] = bad_count["inputs"][0]["data"][:100]
raw_error("raw HTTP: too few JSON elements", "POST", "/v2/models/mlp/infer", json.dumps(bad_count).encode(), 400, "input 'x': 'data' has 100 elements, but shape [16, 256] needs 4096")
hdr = json.dumps({"inputs": [{"name": "x", "shape": [16, 256], "datatype": "FP32", "parameters": {"binary_data_size": 16384}}]}).encode()
raw_error(
    "raw HTTP: binary data shorter than binary_data_size",
    "POST", "/v2/models/mlp/infer", hdr + x.tobytes()[:1000], 400, "binary_data_size 16384 goes past the end of the binary data",
    {"Inference-Header-Content-Length": str(len(hdr))},
)
hdr2 = json.dumps({"inputs": [{"name": "x", "shape": [16, 256], "datatype": "FP32", "parameters": {"binary_data_size": 1000}}]}).encode()
raw_error(
    "raw HTTP: binary_data_size that does not fit the shape",
    "POST", "/v2/models/mlp/infer", hdr2 + x.tobytes()[:1000], 400, "input 'x': binary data has 1000 bytes, but shape [16, 256] of FP32 needs 16384",
    {"Inference-Header-Content-Length": str(len(hdr2))},
)
raw_error(
    "raw HTTP: Inference-Header-Content-Length past the body",
    "POST", "/v2/models/mlp/infer", hdr, 400, "Inference-Header-Content-Length is 99999",
    {"Inference-Header-Content-Length": "99999"},
)
raw_error("raw HTTP: body over --max-body-bytes", "POST", "/v2/models/mlp/infer", b" " * (9 << 20), 413, "larger than the server's limit of 8388608 bytes")
raw_error("raw HTTP: unknown endpoint", "GET", "/v2/nothing", b"", 404, "no endpoint GET /v2/nothing")
raw_error("raw HTTP: unknown model metadata", "GET", "/v2/models/nosuch", b"", 404, "unknown model 'nosuch'")
st, data, headers = raw("POST", "/v2/models/mlp/infer", hdr + x.tobytes(), {"Inference-Header-Content-Length": str(len(hdr))})
lower = {k.lower(): v for k, v in headers.items()}
out = json.loads(data)["outputs"][0] if st == 200 and "inference-header-content-length" not in lower else {}
check("raw HTTP: binary input, no binary output asked -> a JSON response that matches", np.allclose(np.array(out.get("data", [0])).reshape(-1), y_ref.ravel(), atol=1e-4) if out else False, (st, lower))
req_b = json.dumps({"inputs": [{"name": "x", "shape": [16, 256], "datatype": "FP32", "parameters": {"binary_data_size": 16384}}], "parameters": {"binary_data_output": True}}).encode()
st, data, headers = raw("POST", "/v2/models/mlp/infer", req_b + x.tobytes(), {"Inference-Header-Content-Length": str(len(req_b))})
lower = {k.lower(): v for k, v in headers.items()}
n = int(lower.get("inference-header-content-length", "0"))
ok = st == 200 and n > 0 and json.loads(data[:n])["outputs"][0]["parameters"]["binary_data_size"] == 640
check("raw HTTP: binary_data_output -> binary response with Inference-Header-Content-Length", ok and np.allclose(np.frombuffer(data[n:], np.float32).reshape(16, 10), y_ref, atol=1e-4), (st, lower))
# Garbage bytes on a socket: 400 and the connection closes; the server lives on.
for garbage in [b"GARBAGE\r\n\r\n", b"\x00\xff\xfe\x01 / HTTP/1.1\r\n\r\n", b"POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: nope\r\n\r\n"]:
    s = socket.create_connection((HOST, HTTP), timeout=30)
    s.sendall(garbage)
    reply = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    s.close()
    check(f"raw socket garbage {garbage[:12]!r} -> 400", reply.startswith(b"HTTP/1.1 400"), reply[:60])
check("HTTP: server still live after the garbage", h.is_server_live())

# ---- timeout (yolo-timeout: timeout_ms 2, far less than one inference) ----
yolo_x = np.load("target/exports/yolov8n.input.npy")
ym = h.get_model_metadata("yolo-timeout")["inputs"][0]
expect_error("HTTP: per-request timeout", bad(ym["name"], ym["shape"], "FP32", yolo_x, model="yolo-timeout"), "504", "model 'yolo-timeout': the request timed out after 2 ms")

# ---- queue bound (unet: 1 instance, max_queue 1, ~70 ms a run): 6 requests written at once ----
unet_x = np.load("target/exports/unet.input.npy")
unet_ref = np.load("target/exports/unet.expected.npy")
unet_tol = float(open("target/exports/unet.tol").read())
q_hdr = json.dumps({"inputs": [{"name": "input", "shape": list(unet_x.shape), "datatype": "FP32", "parameters": {"binary_data_size": unet_x.nbytes}}], "parameters": {"binary_data_output": True}}).encode()
req = (
    f"POST /v2/models/unet/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\nInference-Header-Content-Length: {len(q_hdr)}\r\n"
    f"Content-Length: {len(q_hdr) + unet_x.nbytes}\r\n\r\n"
).encode() + q_hdr + unet_x.tobytes()
socks = [socket.create_connection((HOST, HTTP), timeout=120) for _ in range(6)]
for s in socks:
    s.sendall(req)
statuses = []
for s in socks:
    reply = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    s.close()
    statuses.append(int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1") else -1)
    head, _, body = reply.partition(b"\r\n\r\n")
    if statuses[-1] == 503:
        check("queue full answer names the model and the bound", b"model 'unet' is busy: its queue of 1 request(s) is full" in body, body[:200])
    elif statuses[-1] == 200:
        n = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"inference-header-content-length")][0])
        out = np.frombuffer(body[n:], np.float32).reshape(unet_ref.shape)
        check("a unet answer accepted under load matches its reference", np.allclose(out, unet_ref, atol=unet_tol, rtol=unet_tol), np.abs(out - unet_ref).max())
check(f"queue bound: 6 requests at once on a queue of 1 -> some 200, some 503 ({sorted(statuses)})", 200 in statuses and 503 in statuses and set(statuses) <= {200, 503})

# ---- repository extension (HTTP) ----
idx = {m["name"]: m for m in h.get_model_repository_index()}
check("HTTP: repository index lists every model directory", sorted(idx) == ["bert-ids", "broken", "cnn", "dyn", "mlp", "unet", "yolo-timeout"], sorted(idx))
check("HTTP: index states (mlp READY v2, broken UNAVAILABLE with a reason)", idx["mlp"]["state"] == "READY" and idx["mlp"]["version"] == "2" and idx["broken"]["state"] == "UNAVAILABLE" and "failed to load" in idx["broken"]["reason"], idx)
h.unload_model("cnn")
check("HTTP: unload cnn -> not ready", not h.is_model_ready("cnn"))
expect_error("HTTP: infer on an unloaded model", bad("image", [4, 3, 32, 32], "FP32", cnn_x, model="cnn"), "503", "model 'cnn' is not ready: unloaded")
h.load_model("cnn")
check("HTTP: load cnn -> ready", h.is_model_ready("cnn"))
r = http_infer("cnn", [("image", cnn_x)])
check("HTTP infer after reload: cnn matches its reference", np.allclose(r.as_numpy("logits"), np.load(f"{M}/cnn.expected.npy"), atol=1e-4))
expect_error("HTTP: load of a model not in the repository", lambda: h.load_model("nosuch"), "404", "model 'nosuch' is not in the model repository")
expect_error("HTTP: load of a broken model", lambda: h.load_model("broken"), "400", "model 'broken' version 1 failed to load")

# ---- gRPC (tritonclient.grpc) ----
g = grpcclient.InferenceServerClient(f"{HOST}:{GRPC}")
check("gRPC: server live and ready", g.is_server_live() and g.is_server_ready())
check("gRPC: server metadata", g.get_server_metadata(as_json=True)["name"] == "rbln-serve")
gm = g.get_model_metadata("mlp", as_json=True)
check("gRPC: mlp metadata", gm["versions"] == ["2"] and gm["inputs"][0]["datatype"] == "FP32" and [int(d) for d in gm["inputs"][0]["shape"]] == [16, 256], gm)
check("gRPC: model ready", g.is_model_ready("mlp") and not g.is_model_ready("broken"))


def grpc_in(name, a, dtype):
    i = grpcclient.InferInput(name, list(a.shape), dtype)
    i.set_data_from_numpy(a)
    return i


r = g.infer("mlp", [grpc_in("x", x, "FP32")])
check("gRPC infer (raw_input_contents): mlp matches its reference", np.allclose(r.as_numpy("y"), y_ref, atol=1e-4))
r = g.infer("bert-ids", [grpc_in("input_ids", ids, "INT64"), grpc_in("attention_mask", mask, "INT64")], outputs=[grpcclient.InferRequestedOutput("last_hidden_state")])
check("gRPC infer, INT64 inputs: bert-ids matches its reference", np.allclose(r.as_numpy("last_hidden_state"), bert_ref, atol=1e-3))
# Typed contents (fp32_contents) through the generated stubs tritonclient ships.
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
import grpc  # noqa: E402

stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"{HOST}:{GRPC}"))
treq = service_pb2.ModelInferRequest(model_name="mlp")
ti = treq.inputs.add(name="x", datatype="FP32", shape=[16, 256])
ti.contents.fp32_contents.extend(x.ravel().tolist())
tr = stub.ModelInfer(treq)
check("gRPC infer (typed contents): mlp matches its reference", np.allclose(np.frombuffer(tr.raw_output_contents[0], np.float32).reshape(16, 10), y_ref, atol=1e-4))


def gbad(model, inputs):
    return lambda: g.infer(model, inputs)


expect_error("gRPC: wrong datatype", gbad("mlp", [grpc_in("x", x.astype(np.int32), "INT32")]), "StatusCode.INVALID_ARGUMENT", "input 'x': datatype INT32 does not match the model's FP32")
expect_error("gRPC: wrong shape", gbad("mlp", [grpc_in("x", x[:2], "FP32")]), "StatusCode.INVALID_ARGUMENT", "input 'x': shape [2, 256] does not match the model's [16, 256]")
expect_error("gRPC: unknown model", gbad("nosuch", [grpc_in("x", x, "FP32")]), "StatusCode.NOT_FOUND", "unknown model 'nosuch'")
expect_error("gRPC: timeout", gbad("yolo-timeout", [grpc_in(ym["name"], yolo_x, "FP32")]), "StatusCode.DEADLINE_EXCEEDED", "timed out after 2 ms")
big = np.zeros((16, 256 * 600), np.float32)  # 9.4 MB, over --max-body-bytes
expect_error("gRPC: message over --max-body-bytes", gbad("mlp", [grpc_in("x", big, "FP32")]), "StatusCode.OUT_OF_RANGE", "decoded message length too large")
gidx = {m["name"]: m for m in g.get_model_repository_index(as_json=True)["models"]}
check("gRPC: repository index", gidx["mlp"]["state"] == "READY" and gidx["broken"]["state"] == "UNAVAILABLE", gidx)
g.unload_model("bert-ids")
check("gRPC: unload -> not ready", not g.is_model_ready("bert-ids"))
expect_error("gRPC: infer on an unloaded model", gbad("bert-ids", [grpc_in("input_ids", ids, "INT64"), grpc_in("attention_mask", mask, "INT64")]), "StatusCode.UNAVAILABLE", "not ready: unloaded")
g.load_model("bert-ids")
check("gRPC: load -> ready", g.is_model_ready("bert-ids"))
expect_error("gRPC: load of a model not in the repository", lambda: g.load_model("nosuch"), "StatusCode.NOT_FOUND", "not in the model repository")
# Queue bound over gRPC: 6 requests (built first, then sent at once) on
# unet's queue of 1.
qreq = service_pb2.ModelInferRequest(model_name="unet")
qreq.inputs.add(name="input", datatype="FP32", shape=list(unet_x.shape))
qreq.raw_input_contents.append(unet_x.tobytes())
futures = [stub.ModelInfer.future(qreq, timeout=120) for _ in range(6)]
codes = []
for f in futures:
    try:
        res = f.result()
        out = np.frombuffer(res.raw_output_contents[0], np.float32).reshape(unet_ref.shape)
        codes.append("ok" if np.allclose(out, unet_ref, atol=unet_tol, rtol=unet_tol) else "wrong")
    except grpc.RpcError as e:
        codes.append(str(e.code()) + ("" if "model 'unet' is busy" in e.details() else " " + e.details()))
codes.sort()
check(f"gRPC queue bound: some succeed (matching), the rest RESOURCE_EXHAUSTED ({codes})", "ok" in codes and "StatusCode.RESOURCE_EXHAUSTED" in codes and set(codes) <= {"ok", "StatusCode.RESOURCE_EXHAUSTED"})

# ---- dynamic batching (dyn: compiled for 3 rows, max_batch_size 3, max_batch_delay_us 2 s) ----
dyn_x = np.load(f"{O}/dynamic-batch.b3.input.npy")
dyn_ref = np.load(f"{O}/dynamic-batch.b3.expected.npy")
dm = g.get_model_metadata("dyn", as_json=True)
check("gRPC: a batched model's metadata has batch dimension -1", [int(d) for d in dm["inputs"][0]["shape"]] == [-1, 8] and [int(d) for d in dm["outputs"][0]["shape"]] == [-1, 4], dm)
# Three single-row requests at once: gathered into one run, each answered with its row.
dreqs = []
for k in range(3):
    q = service_pb2.ModelInferRequest(model_name="dyn", id=str(k))
    q.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    q.raw_input_contents.append(dyn_x[k:k + 1].tobytes())
    dreqs.append(q)
dfut = [stub.ModelInfer.future(q, timeout=120) for q in dreqs]
for k, f in enumerate(dfut):
    res = f.result()
    out = np.frombuffer(res.raw_output_contents[0], np.float32).reshape(1, 4)
    check(f"batching: request {k} gets its own row", res.id == str(k) and np.allclose(out, dyn_ref[k:k + 1], atol=1e-4), (out, dyn_ref[k]))
r = http_infer("dyn", [("x", dyn_x[:2])])
check("batching: a 2-row request gets its 2 rows", np.allclose(r.as_numpy("y"), dyn_ref[:2], atol=1e-4))
expect_error("batching: more rows than max_batch_size", bad("x", [4, 8], "FP32", np.zeros((4, 8), np.float32), model="dyn"), "400", "input 'x': shape [4, 8] does not match the model's [-1, 8] (a batch of 1 to 3 rows)")
c = http.client.HTTPConnection(HOST, METRICS, timeout=30)
c.request("GET", "/metrics")
mtext = c.getresponse().read().decode()
runs = [float(l.split()[-1]) for l in mtext.splitlines() if l.startswith('rbln_serve_batch_rows_count{model="dyn"}')]
rows = [float(l.split()[-1]) for l in mtext.splitlines() if l.startswith('rbln_serve_batch_rows_sum{model="dyn"}')]
check("batching: 5 rows in fewer than 4 runs (rbln_serve_batch_rows)", rows == [5.0] and runs and runs[0] < 4, (runs, rows))

# ---- clients that go away mid-request ----
s = socket.create_connection((HOST, HTTP), timeout=30)
s.sendall(req[: len(req) // 2])  # half of a unet request, then gone
s.close()
s = socket.create_connection((HOST, HTTP), timeout=30)
s.sendall(req)  # a whole one, gone before the answer
s.close()
stub.ModelInfer.future(qreq, timeout=120).cancel()  # gRPC: cancelled
t0 = time.time()
while time.time() - t0 < 30:
    c = http.client.HTTPConnection(HOST, METRICS, timeout=30)
    c.request("GET", "/metrics")
    depth = [ln for ln in c.getresponse().read().decode().splitlines() if ln.startswith('rbln_serve_queue_depth{model="unet"}')]
    if depth and depth[0].split()[-1] == "0":
        break
    time.sleep(0.2)
check("clients gone mid-request: unet's queue drains back to 0", depth and depth[0].split()[-1] == "0", depth)
r = http_infer("unet", [("input", unet_x)])
check("unet still answers correctly after them", np.allclose(r.as_numpy("mask"), unet_ref, atol=unet_tol, rtol=unet_tol))

# ---- metrics ----
c = http.client.HTTPConnection(HOST, METRICS, timeout=30)
c.request("GET", "/metrics")
text = c.getresponse().read().decode()


def metric(line_prefix):
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.split()[-1])
    return None


check("metrics: mlp HTTP successes counted", (metric('rbln_serve_requests_total{model="mlp",outcome="success",protocol="http"}') or 0) >= 4, text[:2000])
check("metrics: mlp gRPC successes counted", (metric('rbln_serve_requests_total{model="mlp",outcome="success",protocol="grpc"}') or 0) >= 2)
check("metrics: bad requests counted", (metric('rbln_serve_requests_total{model="mlp",outcome="bad_request",protocol="http"}') or 0) >= 5)
check("metrics: queue_full counted for unet, HTTP and gRPC", (metric('rbln_serve_requests_total{model="unet",outcome="queue_full",protocol="http"}') or 0) >= 1 and (metric('rbln_serve_requests_total{model="unet",outcome="queue_full",protocol="grpc"}') or 0) >= 1)
check("metrics: timeouts counted", (metric('rbln_serve_requests_total{model="yolo-timeout",outcome="timeout",protocol="http"}') or 0) == 1)
check("metrics: unknown models share one label", (metric('rbln_serve_requests_total{model="_unknown",outcome="not_found",protocol="http"}') or 0) >= 1)
check("metrics: latency histogram", (metric('rbln_serve_request_duration_seconds_count{model="mlp",protocol="http"}') or 0) >= 4 and 'le="0.005"' in text)
check("metrics: queue depth back to 0, capacity 1 for unet", metric('rbln_serve_queue_depth{model="mlp"}') == 0 and metric('rbln_serve_queue_depth{model="unet"}') == 0 and metric('rbln_serve_queue_capacity{model="unet"}') == 1)

# ---- still healthy after all of it ----
check("HTTP: server live and ready at the end", h.is_server_live() and h.is_server_ready())
r = http_infer("mlp", [("x", x)])
check("HTTP infer at the end still matches", np.allclose(r.as_numpy("y"), y_ref, atol=1e-4))
print("client: all checks passed", flush=True)
