"""A torch.nn.Module compiled for the NPU and run.

    python3 examples/python/torch_module.py [out.rbln]

Compiling needs PyTorch (on the host: the venv of
tests/models/exports/torch.txt has it); running needs an NPU (the guest).
Where there is no device, the compiled model is saved for the guest:

    PY=$(scripts/setup-python.sh tests/models/exports/torch.txt | tail -1)
    PYTHONPATH=target/guest-python/rbln "$PY" examples/python/torch_module.py target/small-cnn.rbln
    make vm CMD='insmod kmd/rbln.ko && python3 examples/python/torch_module.py target/small-cnn.rbln'
"""

import sys

import numpy as np

import rbln


def build_and_compile(path: str):
    import torch

    class SmallCNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8 * 16 * 16, 10)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    torch.manual_seed(0)
    net = SmallCNN().eval()
    model = rbln.compile_from_torch(net, [("x", [2, 3, 16, 16], "float32")], output_names=["logits"])
    model.save(path)
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16), dtype=np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.save(path + ".input.npy", x)
    np.save(path + ".expected.npy", want)
    print(f"compiled {model} -> {path}")
    return model


def main(path: str) -> None:
    try:
        model = build_and_compile(path)
    except ImportError:
        model = rbln.CompiledModel(path)  # compiled elsewhere (no torch here)
        print(f"loaded {model}")
    if rbln.device_count() == 0:
        print("no NPU here: run this again in the guest to execute the model")
        return
    x, want = np.load(path + ".input.npy"), np.load(path + ".expected.npy")
    with model.create_runtime() as rt:
        got = rt(x)
    err = float(np.max(np.abs(got - want)))
    print(f"NPU vs PyTorch: max abs error {err:.2e}")
    assert err <= 1e-4 * (1 + float(np.max(np.abs(want))))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/small-cnn.rbln")
