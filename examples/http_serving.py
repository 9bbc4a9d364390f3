"""AddSub and a token streamer on the KServe-v2 HTTP/REST endpoint, called as other programs would.

Serves two models on 127.0.0.1 (a free port), then:
- calls AddSub with the stock ``tritonclient.http`` (binary tensors, its default);
- calls it again with plain JSON, as ``curl`` would (``http.client`` here);
- streams a decoupled model's responses through Triton's generate extension
  (``/generate_stream``, Server-Sent Events: one ``data:`` line per response);
- reads the Prometheus metrics on the same port.

    pip install embedtriton tritonclient[http]
    python examples/http_serving.py
"""

from __future__ import annotations

import http.client
import json

import numpy as np
import tritonclient.http as httpclient

from embedtriton import ModelConfig, Server, Tensor, batch


@batch
def add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    return {"add": a + b, "sub": a - b}


@batch
def tokens(text_input: np.ndarray):
    """A decoupled model: one response per word of the prompt."""
    for word in text_input[0, 0].split():
        yield {"text_output": np.array([[word]], dtype=np.bytes_)}


def main() -> None:
    server = Server()
    f32 = [Tensor(name=n, dtype=np.float32, shape=(-1,)) for n in ("a", "b", "add", "sub")]
    server.bind("AddSub", add_sub, f32[:2], f32[2:], ModelConfig(max_batch_size=8))
    text = [Tensor(name=n, dtype=np.bytes_, shape=(1,)) for n in ("text_input", "text_output")]
    server.bind("Tokens", tokens, text[:1], text[1:], ModelConfig(max_batch_size=1, decoupled=True))
    with server:
        port = server.serve_http("127.0.0.1:0")
        print(f"serving HTTP on 127.0.0.1:{port}")

        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        a, b = np.array([[1.0, 2.0]], np.float32), np.array([[10.0, 20.0]], np.float32)
        inputs = [httpclient.InferInput("a", [1, 2], "FP32"), httpclient.InferInput("b", [1, 2], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("AddSub", inputs)
        print(f"tritonclient.http: add = {result.as_numpy('add')[0]}, sub = {result.as_numpy('sub')[0]}")

        conn = http.client.HTTPConnection("127.0.0.1", port)
        body = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]},
                           {"name": "b", "datatype": "FP32", "shape": [1, 2], "data": [3, 4]}]}  # fmt: skip
        conn.request("POST", "/v2/models/AddSub/infer", json.dumps(body))
        answer = json.loads(conn.getresponse().read())
        print(f"JSON: {[(o['name'], o['data']) for o in answer['outputs']]}")

        conn.request("POST", "/v2/models/Tokens/generate_stream", json.dumps({"text_input": "the quick brown fox"}))
        stream = conn.getresponse()
        print(f"generate_stream: {stream.status} {stream.getheader('Content-Type')}")
        events = [json.loads(line[len("data: ") :]) for line in stream.read().decode().split("\n\n") if line]
        print(f"  {len(events)} events: {' '.join(e['text_output'] for e in events)}")

        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
        line = next(m for m in metrics.splitlines() if m.startswith('nv_inference_request_success{model="AddSub"'))
        print(f"metrics: {line}")
        conn.close()


if __name__ == "__main__":
    main()
