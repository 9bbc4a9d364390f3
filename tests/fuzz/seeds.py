"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/seed-*), which are
committed: `python tests/fuzz/seeds.py` in an environment with embedtriton, tritonclient[grpc,http],
openai and hypothesis (the nox `fuzz` session's), re-run when a protocol feature is added.

Recorded, not made up: a real server (AddSub, an OpenAI chat model) is served over gRPC and HTTP
behind a recording proxy, and stock clients talk to it: tritonclient.grpc (plain, gzip and deflate
compressed, a stream), tritonclient.http (JSON, binary tensors, compressed), curl, and the openai
client (a completion, a stream). What each client connection sent becomes a seed of the connection
targets (http1_conn, h2_session); the bodies and messages in it, of the decoder targets. The
hypothesis strategies of tests/adversarial/ add requests no client sends. Each file starts with the
target's configuration byte(s) where it has some (see the targets' comments). Regression inputs
(regress-*, an input that once found a bug) are kept by hand and never rewritten here.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import shutil
import struct
import subprocess
import sys
import threading
import warnings
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"


class Recorder:
    """A TCP proxy on a free port in front of `port`, keeping what each client connection sent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent: list[bytearray] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.listen = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        record = bytearray()
        self.sent.append(record)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, keep: bytearray | None) -> None:
            try:
                while data := await src.read(65536):
                    if keep is not None:
                        keep += data
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                try:
                    dst.write_eof() if dst.can_write_eof() else dst.close()
                except (ConnectionError, OSError, RuntimeError):
                    pass

        await asyncio.gather(pipe(reader, up_writer, record), pipe(up_reader, writer, None))
        writer.close()
        up_writer.close()


def write(target: str, data: bytes, kind: str = "seed") -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{kind}-{hashlib.sha1(data).hexdigest()[:16]}").write_bytes(data)


def grpc_messages(stream: bytes) -> list[tuple[int, bytes]]:
    """The gRPC messages (flag, payload) in the DATA frames of a client's HTTP/2 bytes."""
    out: list[tuple[int, bytes]] = []
    pending: dict[int, bytearray] = {}
    at = 24  # the preface
    while at + 9 <= len(stream):
        length = int.from_bytes(stream[at : at + 3], "big")
        kind, flags, sid = stream[at + 3], stream[at + 4], int.from_bytes(stream[at + 5 : at + 9], "big") & 0x7FFFFFFF
        payload = stream[at + 9 : at + 9 + length]
        at += 9 + length
        if kind != 0:
            continue
        if flags & 0x8:  # padded
            payload = payload[1 : len(payload) - payload[0]]
        buf = pending.setdefault(sid, bytearray())
        buf += payload
        while len(buf) >= 5 and len(buf) >= 5 + int.from_bytes(buf[1:5], "big"):
            n = int.from_bytes(buf[1:5], "big")
            out.append((buf[0], bytes(buf[5 : 5 + n])))
            del buf[: 5 + n]
    return out


def http_requests(stream: bytes) -> list[tuple[bytes, bytes]]:
    """(head, body) of each request in a client's HTTP/1.1 bytes (Content-Length bodies)."""
    out = []
    while b"\r\n\r\n" in stream:
        head, rest = stream.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        out.append((head, rest[:length]))
        stream = rest[length:]
    return out


def record_clients() -> tuple[list[bytes], list[bytes]]:
    """What stock clients send: (HTTP/1.1 connections, HTTP/2 connections)."""
    import openai
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from embedtriton import ModelConfig, Server, Tensor, batch
    from embedtriton.openai import bind_chat

    @batch
    def add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
        return {"add": a + b, "sub": a - b}

    def parrot(messages: list[dict], max_tokens: int | None = None, **params: object):
        for word in ["You", "said:", *str(messages[-1]["content"]).split()][: max_tokens or 64]:
            yield word + " "

    server = Server()
    server.bind(
        model_name="AddSub",
        infer_func=add_sub,
        inputs=[Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="add", dtype=np.float32, shape=(-1,)), Tensor(name="sub", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    bind_chat(server, "parrot", parrot)
    with server:
        grpc_rec = Recorder(int(server.serve_grpc("127.0.0.1:0")))
        http_rec = Recorder(server.serve_http("127.0.0.1:0", openai=True))
        a = np.arange(6, dtype=np.float32).reshape(2, 3)

        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_rec.listen}") as client:
            client.is_server_live()
            client.get_model_metadata("AddSub")
            for compression in (None, "gzip", "deflate"):
                inputs = [grpcclient.InferInput("a", [2, 3], "FP32"), grpcclient.InferInput("b", [2, 3], "FP32")]
                for i in inputs:
                    i.set_data_from_numpy(a)
                client.infer("AddSub", inputs, request_id="r1", compression_algorithm=compression,
                             outputs=[grpcclient.InferRequestedOutput("add")])  # fmt: skip
        with httpclient.InferenceServerClient(f"127.0.0.1:{http_rec.listen}") as client:
            client.is_server_ready()
            client.get_model_config("AddSub")
            for binary in (False, True):
                for compression in (None, "gzip"):
                    inputs = [httpclient.InferInput("a", [2, 3], "FP32"), httpclient.InferInput("b", [2, 3], "FP32")]
                    for i in inputs:
                        i.set_data_from_numpy(a, binary_data=binary)
                    client.infer("AddSub", inputs, request_compression_algorithm=compression,
                                 outputs=[httpclient.InferRequestedOutput("add", binary_data=binary)])  # fmt: skip
        if shutil.which("curl"):
            body = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 2], "data": [1.5, -2e-3]}
                                          for n in "ab"]})  # fmt: skip
            url = f"http://127.0.0.1:{http_rec.listen}"
            subprocess.run(["curl", "-s", "-d", body, f"{url}/v2/models/AddSub/infer"], capture_output=True, check=True)
            subprocess.run(["curl", "-s", f"{url}/v2/health/ready"], capture_output=True, check=True)
        chat = openai.OpenAI(base_url=f"http://127.0.0.1:{http_rec.listen}/v1", api_key="none")
        chat.chat.completions.create(model="parrot", messages=[{"role": "user", "content": "hi there"}], max_tokens=3)
        for _ in chat.chat.completions.create(
            model="parrot", messages=[{"role": "user", "content": "a b"}], stream=True
        ):
            pass
        chat.close()
        server.stop()
    return [bytes(b) for b in http_rec.sent if b], [bytes(b) for b in grpc_rec.sent if b]


def from_strategies() -> tuple[list[bytes], list[tuple[bytes, int]]]:
    """Requests the adversarial tests' hypothesis strategies draw: (protobuf messages, (body, header_len))."""
    sys.path.insert(0, str(HERE.parents[0] / "adversarial"))
    warnings.simplefilter("ignore")  # (.example() outside a test)
    import test_grpc_decoder_in_c as pb
    import test_http_decoder_in_c as js

    messages = []
    for strategy in (pb.plain_requests(), pb.any_requests()):
        for _ in range(30):
            m = strategy.example()
            messages.append(m if isinstance(m, bytes) else m.SerializeToString())
    bodies = []
    for strategy in (js.client_bodies(), js.any_bodies()):
        for _ in range(30):
            case = strategy.example()
            body, header_len = (case if isinstance(case, tuple) else (case, -1))[:2]
            bodies.append((bytes(body), int(header_len)))
    return messages, bodies


def h2_frames() -> list[bytes]:
    """Client connections no stock client makes, written with the h2 package: many streams at once,
    a message split across DATA frames and padded, trailers, resets, pings, window updates,
    priority, a compressed message, a CONTINUATION, and a GOAWAY."""
    import h2.config
    import h2.connection
    import h2.settings

    path = b"/inference.GRPCInferenceService/ModelInfer"
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"x"),
               (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip
    message = bytes([0]) + (12).to_bytes(4, "big") + b"\x0a\x06AddSub\x12\x011\x1a\x00"
    out = []
    for variant in range(4):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
        for sid in (1, 3, 5):
            extra = [(b"grpc-encoding", b"gzip")] if variant == 1 and sid == 3 else []
            conn.send_headers(sid, headers + extra + [(b"x-pad", b"v" * (sid * 100))])
            body = message if not extra else bytes([1]) + len(gz := gzip.compress(message[5:])).to_bytes(4, "big") + gz
            conn.send_data(sid, body[:3], pad_length=4 if variant == 2 else None)
            conn.send_data(sid, body[3:])
            if variant == 3 and sid == 5:
                conn.reset_stream(sid)
            else:
                conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)  # client trailers
        conn.ping(b"12345678")
        conn.increment_flow_control_window(1 << 16)
        conn.prioritize(1, weight=200, depends_on=0, exclusive=False)
        if variant == 3:
            conn.close_connection()
        out.append(conn.data_to_send())
    return out


def numbers() -> list[bytes]:
    texts = ["0", "-0", "1", "-1", "0.1", "1e308", "1e309", "2.2250738585072014e-308", "4.9e-324", "1e-400",
             "123456789012345", "1234567890123456", "9007199254740993", "0.30000000000000004", "3.4028235e38",
             "3.4028236e38", "1.5E+22", "1e23", "9223372036854775807", "-9223372036854775808", "18446744073709551616",
             "1.00000000000000011102230246251565404236316680908203125", "12345678901234567890e-30"]  # fmt: skip
    doubles = [0.1, -0.0, 1e300, 5e-324, float("nan"), float("inf"), 1 / 3, 2.0**53, 123.456]
    return [t.encode() for t in texts] + [struct.pack("<d", d) for d in doubles]


def main() -> None:
    http, grpc = record_clients()
    print(f"seeds: recorded {len(http)} HTTP/1.1 and {len(grpc)} HTTP/2 client connections")
    for stream in http:
        write("http1_conn", bytes([2 + 3 * 2]) + stream)  # max_header_bytes 16 KiB, max_body_bytes 1 MiB
        write("http1_conn", bytes([0 + 3 * 1]) + stream)  # 64 and 64: refusals
    bodies = []
    for stream in http:
        for head, body in http_requests(stream):
            if (
                head.startswith(b"POST")
                and b"/infer" in head.split(b"\r\n")[0]
                and b"content-encoding" not in head.lower()
            ):
                header_len = -1
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"inference-header-content-length:"):
                        header_len = int(line.split(b":")[1])
                bodies.append((body, header_len))
    messages = []
    for stream in grpc:
        for mode in (2, 2 + 9, 2 + 3):  # 1 MiB messages; answered plainly, gzip-compressed, or with an error
            write("h2_session", bytes([mode]) + stream[24:])
        for flag, payload in grpc_messages(stream):
            if flag:
                for enc in (0, 1):
                    write("inflate", bytes([enc | 4 << 1]) + payload)
                continue
            messages.append(payload)
    for stream in h2_frames():
        write("h2_session", bytes([2]) + stream[24:])
        write("h2_session", bytes([1 + 27]) + stream[24:])  # 4 KiB messages, a 4 KiB budget
    pb, js = from_strategies()
    messages += pb
    bodies += js
    for m in messages:
        write("kserve_pb", m)
        write("kserve_pb_diff", m)
        write("inflate", bytes([1 | 4 << 1]) + gzip.compress(m))
        write("inflate", bytes([0 | 3 << 1]) + zlib.compress(m))
    for body, header_len in bodies:
        binary = header_len >= 0 and header_len < 65536
        write("kserve_json", bytes([1 if binary else 0, header_len & 255 if binary else 0,
                                    header_len >> 8 if binary else 0]) + body)  # fmt: skip
    for n in numbers():
        write("numtext", n)
    for target in sorted(p.name for p in CORPUS.iterdir()):
        print(f"seeds: {target}: {len(list((CORPUS / target).iterdir()))} files")


if __name__ == "__main__":
    main()
