"""Unload every model of a running rbln-serve through the repository
extension (REST), then check that none is ready.

    python3 tests/serve/unload_all.py HTTP_PORT
"""

import json
import sys
import urllib.request

BASE = f"http://127.0.0.1:{int(sys.argv[1])}"


def post(path, body=b"{}"):
    with urllib.request.urlopen(urllib.request.Request(BASE + path, data=body, method="POST"), timeout=60) as r:
        return r.status, r.read()


_, index = post("/v2/repository/index")
models = json.loads(index)
assert models, "the index is empty"
for m in models:
    status, _ = post(f"/v2/repository/models/{m['name']}/unload")
    assert status == 200, (m, status)
_, ready = post("/v2/repository/index", b'{"ready": true}')
assert json.loads(ready) == [], ready
_, index = post("/v2/repository/index")
assert all(m["state"] == "UNAVAILABLE" for m in json.loads(index)), index
print(f"unloaded {len(models)} models")
