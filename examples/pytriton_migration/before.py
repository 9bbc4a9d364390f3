"""A PyTriton application as users have it: two models (AddSub and a Linear layer, both with
@batch), started in the background, queried with ModelClient over HTTP and gRPC, stopped.

before.py imports pytriton; after.py is the same file with `pytriton` changed to
`embedtriton.pytriton` in the imports, and runs on embedtriton (no tritonserver process).
Ports come from HTTP_PORT / GRPC_PORT / METRICS_PORT (default 8000 / 8001 / 8002).
"""

import os

import numpy as np

from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

HOST = "127.0.0.1"
HTTP_PORT = int(os.environ.get("HTTP_PORT", "8000"))
GRPC_PORT = int(os.environ.get("GRPC_PORT", "8001"))
METRICS_PORT = int(os.environ.get("METRICS_PORT", "8002"))

WEIGHTS = np.array([[0.5, -1.0, 2.0], [1.5, 0.0, -0.5]], dtype=np.float32)


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@batch
def linear(**inputs):
    (x,) = inputs.values()
    return [x @ WEIGHTS]


def main():
    config = TritonConfig(
        http_address=HOST, http_port=HTTP_PORT, grpc_address=HOST, grpc_port=GRPC_PORT, metrics_port=METRICS_PORT
    )
    triton = Triton(config=config)
    triton.bind(
        model_name="AddSub",
        infer_func=add_sub,
        inputs=[Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="add", dtype=np.float32, shape=(-1,)), Tensor(name="sub", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=16),
    )
    triton.bind(
        model_name="Linear",
        infer_func=linear,
        inputs=[Tensor(dtype=np.float32, shape=(2,))],
        outputs=[Tensor(dtype=np.float32, shape=(3,))],
        config=ModelConfig(max_batch_size=64),
    )
    triton.run()
    try:
        with ModelClient(f"{HOST}:{HTTP_PORT}", "AddSub", init_timeout_s=30) as client:
            result = client.infer_sample(np.array([3.0, 4.0], np.float32), np.array([1.0, 1.0], np.float32))
            print("AddSub over HTTP:", result["add"].tolist(), result["sub"].tolist())
            assert result["add"].tolist() == [4.0, 5.0] and result["sub"].tolist() == [2.0, 3.0]

        x = np.arange(8, dtype=np.float32).reshape(4, 2)
        with ModelClient(f"grpc://{HOST}:{GRPC_PORT}", "Linear", init_timeout_s=30) as client:
            result = client.infer_batch(x)
            print("Linear over gRPC:", result["OUTPUT_1"].tolist())
            np.testing.assert_allclose(result["OUTPUT_1"], x @ WEIGHTS)
    finally:
        triton.stop()
    print("done")


if __name__ == "__main__":
    main()
