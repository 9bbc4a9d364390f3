"""GPU tensors in and out without a copy through the host: a cupy array goes in, the callable sees
the caller's own device memory (as a cupy array), returns a GPU array, and the caller gets the
output as a DeviceArray in GPU memory that Triton wrote to, wrapped by cupy with no copy. A
second model takes torch tensors (gpu_arrays="torch"), and a host input declared
Tensor(device="gpu") reaches the callable on the GPU.

    python examples/gpu_zero_copy.py

Needs a CUDA GPU and cupy (torch for the second model); says so and exits 0 without them.
"""

import sys

import numpy as np

from embedtriton import ModelConfig, Server, Tensor
from embedtriton.triton.devices import cuda_devices

gpus, why = cuda_devices()
try:
    import cupy
except ImportError as exc:
    cupy, why = None, why or f"cupy is not importable ({exc})"
if not gpus or cupy is None:
    print(f"this example needs a CUDA GPU and cupy: {why}")
    sys.exit(0)

seen = {}


def normalize(requests):
    out = []
    for r in requests:
        x = r["x"]  # a cupy array: for a single request, the caller's own memory
        seen["pointer"] = x.data.ptr
        out.append({"y": (x - x.mean()) / (x.std() + 1e-6)})  # a cupy result, copied device to device
    return out


def scale(requests):  # gpu_arrays="torch": GPU inputs arrive as torch tensors
    return [{"y": r["x"] * r["factor"].to(r["x"].device)} for r in requests]


server = Server()
vector = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
server.bind(
    "normalize", normalize, vector, [Tensor(name="y", dtype=np.float32, shape=(-1,))], ModelConfig(batching=False)
)
with server:
    x = cupy.random.rand(1 << 20, dtype=cupy.float32)
    out = server.model("normalize").infer({"x": x}, output_device="gpu")["y"]  # a DeviceArray
    y = cupy.from_dlpack(out)  # no copy: y is the memory Triton wrote the output to
    print(f"the callable read the caller's memory: {seen['pointer'] == x.data.ptr}")
    print(f"output: {out!r}, mean {float(y.mean()):+.3f}, std {float(y.std()):.3f}")

try:
    import torch
except ImportError:
    print("torch is not installed: the torch model is skipped")
    sys.exit(0)

server = Server()
server.bind(
    "scale",
    scale,
    [
        Tensor(name="x", dtype=np.float32, shape=(-1,)),
        Tensor(name="factor", dtype=np.float32, shape=(1,), device="gpu"),
    ],
    [Tensor(name="y", dtype=np.float32, shape=(-1,))],
    ModelConfig(batching=False, gpu_arrays="torch"),
)
with server:
    t = torch.arange(4, dtype=torch.float32, device="cuda")
    # factor is a host array; its Tensor says device="gpu", so the callable gets it on the GPU too
    out = server.model("scale").infer({"x": t, "factor": np.array([2.5], np.float32)}, output_device="gpu")
    print(f"torch in, torch out: {torch.from_dlpack(out['y']).tolist()}")
