"""Which HTTP/1.1 parser the REST endpoint is built on: the candidates parse the same pipelined
KServe-v2 requests (an AddSub infer with a JSON body, keep-alive) and the table shows requests
parsed per second (median of interleaved rounds) and the ratio to the fastest.

- ``httptools``: llhttp (Node.js's parser, C) behind a callback API;
- ``h11``: a pure-Python state machine (the one behind httpcore/httpx and hypercorn);
- ``http.server``: the standard library's, which parses headers with ``email.parser`` per
  request and needs a thread per connection.

    python benchmarks/bench_http_parsers.py
"""

from __future__ import annotations

import http.server
import io
import json
import statistics
import time

BODY = json.dumps(
    {
        "inputs": [
            {"name": "a", "shape": [1, 1], "datatype": "FP32", "data": [1.0]},
            {"name": "b", "shape": [1, 1], "datatype": "FP32", "data": [2.0]},
        ]
    }
).encode()
REQUEST = (
    b"POST /v2/models/AddSub/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: bench\r\n"
    b"Content-Type: application/json\r\nAccept: */*\r\nContent-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)
N = 20_000
STREAM = REQUEST * N  # pipelined on one connection, fed in 64 KiB reads
CHUNK = 64 * 1024


def with_httptools() -> int:
    import httptools

    done = [0]

    class Protocol:
        def on_message_complete(self) -> None:
            done[0] += 1

        def on_body(self, body: bytes) -> None:
            pass

        def on_header(self, name: bytes, value: bytes) -> None:
            pass

        def on_url(self, url: bytes) -> None:
            pass

    parser = httptools.HttpRequestParser(Protocol())
    for i in range(0, len(STREAM), CHUNK):
        parser.feed_data(STREAM[i : i + CHUNK])
    return done[0]


def with_h11() -> int:
    import h11

    conn = h11.Connection(h11.SERVER)
    done = 0
    for i in range(0, len(STREAM), CHUNK):
        conn.receive_data(STREAM[i : i + CHUNK])
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                break
            if isinstance(event, h11.EndOfMessage):
                done += 1
                conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                conn.send(h11.EndOfMessage())
                conn.start_next_cycle()
    return done


def with_stdlib() -> int:
    rfile = io.BufferedReader(io.BytesIO(STREAM), CHUNK)  # type: ignore[arg-type]
    done = 0

    class Handler(http.server.BaseHTTPRequestHandler):
        def __init__(self) -> None:  # parse only: no socket
            self.rfile, self.wfile = rfile, io.BytesIO()
            self.client_address, self.server = ("127.0.0.1", 0), None  # type: ignore[assignment]

        def log_message(self, *args: object) -> None:
            pass

    handler = Handler()
    for _ in range(N):
        handler.raw_requestline = rfile.readline(65537)
        handler.parse_request()
        rfile.read(int(handler.headers["Content-Length"]))
        done += 1
    return done


def main() -> None:
    candidates = {"httptools": with_httptools, "h11": with_h11, "http.server": with_stdlib}
    rates: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(5):  # interleaved rounds
        for name, parse in candidates.items():
            start = time.perf_counter()
            assert parse() == N
            rates[name].append(N / (time.perf_counter() - start))
    best = max(statistics.median(r) for r in rates.values())
    print("| parser | requests parsed / s | × fastest |\n| --- | --- | --- |")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} | {median / best:.2f} |")


if __name__ == "__main__":
    main()
