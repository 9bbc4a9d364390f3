"""Restricted APIs and header forwarding, Triton's way, on both endpoints.

Serves one model on 127.0.0.1 (free ports) with Triton's options:
- ``restricted_protocol`` / ``restricted_api`` (``--grpc-restricted-protocol`` /
  ``--http-restricted-api``): inference needs a key, the model repository and logging an admin
  key; everything else stays open;
- ``header_forward_pattern``: ``x-tenant`` reaches the model as a request parameter (under the
  name as the client sent it: over HTTP names keep their case, as in Triton).

Then calls it with the stock ``tritonclient`` without and with the keys.

    pip install "embedtriton[grpc]" tritonclient[all]
    python examples/restricted_apis.py
"""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from embedtriton import ModelConfig, Server, Tensor

RESTRICTIONS = ["inference:infer-key=let-me-in", "model-repository,logging:admin-key=s3cret"]


def greet(requests):
    """Answers with the tenant its request came from (a forwarded header)."""
    return [
        {"greeting": np.array([[f"hello, {r.parameters.get('x-tenant', 'nobody')}"]], np.object_)} for r in requests
    ]


def main() -> None:
    server = Server()
    server.bind(
        "Greet",
        greet,
        [Tensor(name="x", dtype=np.float32, shape=(1,))],
        [Tensor(name="greeting", dtype=np.bytes_, shape=(1,))],
        ModelConfig(max_batch_size=4),
    )
    with server:
        grpc_port = server.serve_grpc("127.0.0.1:0", restricted_protocol=RESTRICTIONS, header_forward_pattern="^x-")
        http_port = server.serve_http("127.0.0.1:0", restricted_api=RESTRICTIONS, header_forward_pattern="^x-")

        g = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        x = grpcclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.zeros((1, 1), np.float32))
        print("gRPC live (health is open):", g.is_server_live())
        try:
            g.infer("Greet", [x])
        except InferenceServerException as exc:
            print(f"gRPC infer without the key: {exc.status()} {exc.message()}")
        # over gRPC, Triton prefixes the header: triton-grpc-protocol-<key>
        headers = {"triton-grpc-protocol-infer-key": "let-me-in", "x-tenant": "acme"}
        print("gRPC infer with it:", g.infer("Greet", [x], headers=headers).as_numpy("greeting")[0, 0].decode())

        h = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        try:
            h.unload_model("Greet")
        except InferenceServerException as exc:
            print(f"HTTP unload without the admin key: {exc.status()} {exc.message()}")
        print("HTTP log settings with it:", h.get_log_settings(headers={"admin-key": "s3cret"})["log_verbose_level"])
        hx = httpclient.InferInput("x", [1, 1], "FP32")
        hx.set_data_from_numpy(np.zeros((1, 1), np.float32))
        result = h.infer("Greet", [hx], headers={"infer-key": "let-me-in", "x-tenant": "globex"})
        print("HTTP infer with the key:", result.as_numpy("greeting")[0, 0].decode())


if __name__ == "__main__":
    main()
