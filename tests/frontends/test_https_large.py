"""HTTPS through the C transport with answers and bodies larger than a TLS record and than one
read: pipelined, keep-alive, answered whole and in order."""

from __future__ import annotations

import json
import socket
import ssl

import numpy as np

from embedtriton import HttpOptions, ModelConfig, Server, Tensor, batch


def test_large_pipelined_https_requests(certs):
    server = Server()
    server.bind(
        "Echo",
        batch(lambda x: {"y": x}),
        [Tensor(name="x", dtype=np.float32, shape=(-1,))],
        [Tensor(name="y", dtype=np.float32, shape=(-1,))],
        ModelConfig(max_batch_size=4),
    )
    with server:
        options = HttpOptions(tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key"))
        port = server.serve_http("127.0.0.1:0", options=options)
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        count, size = 6, 200_000
        data = np.arange(size, dtype=np.float32)
        header = json.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, size], "parameters": {"binary_data_size": size * 4}}],
             "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
        ).encode()  # fmt: skip
        body = header + data.tobytes()
        request = (
            b"POST /v2/models/Echo/infer HTTP/1.1\r\nHost: localhost\r\nInference-Header-Content-Length: %d\r\n"
            b"Content-Length: %d\r\n\r\n" % (len(header), len(body))
        ) + body
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(request * count + b"GET /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n")
                received = b""
                while chunk := s.recv(1 << 20):
                    received += chunk
        for _ in range(count):
            head, _, rest = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
            length, json_length = int(fields[b"Content-Length"]), int(fields[b"Inference-Header-Content-Length"])
            answer, received = rest[:length], rest[length:]
            assert json.loads(answer[:json_length])["outputs"][0]["parameters"]["binary_data_size"] == size * 4
            np.testing.assert_array_equal(np.frombuffer(answer[json_length:], np.float32), data)
        assert received.startswith(b"HTTP/1.1 200")
