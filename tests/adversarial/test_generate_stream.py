"""``/generate_stream`` (Triton's generate extension, Server-Sent Events) against clients that read
nothing: the model is held back once its unread events pile up, and after ``request_timeout_s``
without reading the client is disconnected and its request cancelled, so a few such clients
cannot keep the model's instances for ever."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import pytest
from serving import unread_posts, wait_for

from embedtriton import InstanceGroup, ModelConfig, Server, Tensor, batch

TEXT_IN = [Tensor(name="text_input", dtype=np.bytes_, shape=(1,))]
TEXT_OUT = [Tensor(name="text_output", dtype=np.bytes_, shape=(1,))]


class Flags:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0  # generators running


@pytest.fixture(scope="module")
def served():
    flags = Flags()
    piece = np.array([[b"x" * 4096]], dtype=np.bytes_)

    @batch
    def flood(text_input):  # events as fast as it can make them, until its stream is closed
        with flags.lock:
            flags.open += 1
        try:
            while True:
                yield {"text_output": piece}
        finally:
            with flags.lock:
                flags.open -= 1

    server = Server()
    config = ModelConfig(max_batch_size=1, decoupled=True, instance_group=[InstanceGroup(count=2)])
    server.bind("Flood", flood, TEXT_IN, TEXT_OUT, config)
    server.bind("Echo", lambda requests: [{"text_output": r["text_input"]} for r in requests], TEXT_IN, TEXT_OUT)
    with server:
        yield server.serve_http("127.0.0.1:0", request_timeout_s=0.5), flags


def test_a_generate_stream_whose_client_reads_nothing_is_let_go(served):
    port, flags = served
    socks = unread_posts(port, "/v2/models/Flood/generate_stream", json.dumps({"text_input": "go"}).encode(), 2)
    try:
        assert wait_for(lambda: flags.open == 2), f"{flags.open} of 2 streams started"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # the others are served meanwhile
        conn.request("POST", "/v2/models/Echo/generate", json.dumps({"text_input": "abc"}))
        answer = conn.getresponse()
        assert answer.status == 200 and json.loads(answer.read())["text_output"] == "abc"
        conn.close()
        # the sockets' buffers fill, the generators are held back, then 0.5 s without reading passes
        assert wait_for(lambda: flags.open == 0, 20), f"{flags.open} streams nobody reads kept their generators"
    finally:
        for s in socks:
            s.close()
