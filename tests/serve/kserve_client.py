"""Drive a running rbln-serve with the kserve package's Open Inference
Protocol clients (InferenceRESTClient with protocol v2, and
InferenceGRPCClient), as a KServe user's code would, and check every answer.

    python3 tests/serve/kserve_client.py HTTP_PORT GRPC_PORT

Uses the repository tests/vm/serve.sh builds (mlp, bert-ids). Prints
"ok - ..." per check; exits 1 at the first failure.
"""

import asyncio
import sys

import httpx
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from checks import check

HTTP, GRPC = (int(p) for p in sys.argv[1:3])
BASE = f"http://127.0.0.1:{HTTP}"
M = "target/models"
O = "target/onnx"


def request(model, arrays, binary):
    inputs = []
    for name, a, dtype in arrays:
        i = InferInput(name, list(a.shape), dtype)
        i.set_data_from_numpy(a, binary_data=binary)
        inputs.append(i)
    return InferRequest(model_name=model, infer_inputs=inputs, request_id=f"{model}-{int(binary)}")


async def main():
    x = np.load(f"{M}/mlp.input.npy")
    y_ref = np.load(f"{M}/mlp.expected.npy")
    ids = np.load(f"{O}/bert-ids.input0.npy")
    mask = np.load(f"{O}/bert-ids.input1.npy")
    bert_ref = np.load(f"{O}/bert-ids.expected.npy")

    rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=120, retries=0))
    check("kserve REST: server live", await rest.is_server_live(BASE))
    check("kserve REST: server ready", await rest.is_server_ready(BASE))
    check("kserve REST: mlp ready, nosuch not", await rest.is_model_ready(BASE, "mlp") and not await rest.is_model_ready(BASE, "nosuch"))
    for binary in (False, True):
        r = await rest.infer(BASE, request("mlp", [("x", x, "FP32")], binary), model_name="mlp")
        out = r.get_output_by_name("y").as_numpy()
        check(f"kserve REST infer ({'binary' if binary else 'JSON'} data): mlp matches", r.id == f"mlp-{int(binary)}" and np.allclose(out.reshape(y_ref.shape), y_ref, atol=1e-4))
    r = await rest.infer(BASE, request("bert-ids", [("input_ids", ids, "INT64"), ("attention_mask", mask, "INT64")], True), model_name="bert-ids")
    out = r.get_output_by_name("last_hidden_state").as_numpy()
    check("kserve REST infer, INT64 inputs: bert-ids matches", np.allclose(out.reshape(bert_ref.shape), bert_ref, atol=1e-3))
    # Several at once on one client.
    rs = await asyncio.gather(*(rest.infer(BASE, request("mlp", [("x", x, "FP32")], True), model_name="mlp") for _ in range(8)))
    check("kserve REST: 8 concurrent requests all match", all(np.allclose(r.get_output_by_name("y").as_numpy().reshape(y_ref.shape), y_ref, atol=1e-4) for r in rs))
    try:
        await rest.infer(BASE, request("mlp", [("x", x[:4], "FP32")], False), model_name="mlp")
        check("kserve REST: a wrong shape is refused", False, "(no error)")
    except httpx.HTTPStatusError as e:
        body = e.response.json()
        check("kserve REST: a wrong shape gets 400 naming it", e.response.status_code == 400 and "shape [4, 256] does not match the model's [16, 256]" in body["error"], body)
    await rest.close()

    grpc = InferenceGRPCClient(f"127.0.0.1:{GRPC}", timeout=120, retries=0)
    check("kserve gRPC: server live and ready", await grpc.is_server_live() and await grpc.is_server_ready())
    check("kserve gRPC: mlp ready", await grpc.is_model_ready("mlp"))
    r = await grpc.infer(request("mlp", [("x", x, "FP32")], True))
    check("kserve gRPC infer: mlp matches", np.allclose(r.get_output_by_name("y").as_numpy().reshape(y_ref.shape), y_ref, atol=1e-4))
    try:
        await grpc.infer(request("nosuch", [("x", x, "FP32")], True))
        check("kserve gRPC: an unknown model is refused", False, "(no error)")
    except Exception as e:  # grpc.aio.AioRpcError
        check("kserve gRPC: an unknown model gets NOT_FOUND naming it", "NOT_FOUND" in str(e.code()) and "unknown model 'nosuch'" in e.details(), e)
    await grpc.close()
    print("kserve client: all checks passed", flush=True)


asyncio.run(main())
