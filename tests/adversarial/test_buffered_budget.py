"""The budget of request bytes buffered across connections (``max_buffered_bytes`` of HttpOptions
and GrpcOptions) against a flood of slow bodies.

In a child process (``embedtriton serve --max-buffered-bytes 32 MiB``), 200 clients each declare a
64 MiB body (an HTTP/1.1 Content-Length, a gRPC message length) and send 2 MiB of it, 64 KiB per
client per round, so that they all overlap: 400 MiB offered against a 32 MiB budget. The server's
peak memory grows by at most the budget plus 64 KiB per connection and a stated slack (where it
grows by 280 to 400 MiB without the budget), the requests that would take it over
are refused (HTTP 503, gRPC RESOURCE_EXHAUSTED, naming the limit), a normal request meanwhile gets
its answer or a prompt refusal, and after the flood the server serves as before. In process, the
transports alone show who is refused: the request over the budget, after the answers to the
requests before it on its connection; and what they hold comes back to zero."""

from __future__ import annotations

import gc
import json
import os
import re
import select
import socket
import time

import numpy as np
import pytest
from serving import Served, read_all, wait_for

_h2 = pytest.importorskip("embedtriton._h2")
grpcclient = pytest.importorskip("tritonclient.grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException
h2_events = pytest.importorskip("h2.events")
h2_exceptions = pytest.importorskip("h2.exceptions")
from test_transport import MAX_MSG, REQUEST_HEADERS, Handler, Raw  # noqa: E402

MIB = 1 << 20
BUDGET = 32 * MIB
FLOOD = 200  # clients
DECLARED = 64 * MIB  # each one's declared body (the default max_body_bytes / max_message_bytes)
SENT = 2 * MIB  # what each one sends of it
CHUNK = 64 << 10  # per client per round
# Beyond the budget, the peak may hold 64 KiB per connection (HTTP: its first read buffer, outside
# the budget; gRPC: its call's first 64 KiB of message, which the allocator keeps for reuse once the
# call is refused) and SLACK: freed buffers the allocator keeps, the refusals' answers, and under
# AddressSanitizer its shadow memory (an eighth of what is allocated).
PER_CONNECTION = 64 << 10
SLACK = 32 * MIB
LIMIT_MIB = (BUDGET + FLOOD * PER_CONNECTION + SLACK) / MIB  # 76.5 MiB; without the budget, 400 MiB and more
HTTP_REFUSAL = f"the server holds more than {BUDGET} bytes of incoming requests (max_buffered_bytes); retry later"
GRPC_REFUSAL = (
    f"the server holds more than {BUDGET} bytes of incoming request messages (max_buffered_bytes); retry later"
)

MODELS = """
import numpy as np
from embedtriton import ModelConfig, Tensor

def bind(server):
    server.bind("Double", lambda requests: [{"y": r["x"] * 2} for r in requests],
                [Tensor(name="x", dtype=np.float32, shape=(1,))], [Tensor(name="y", dtype=np.float32, shape=(1,))],
                ModelConfig(max_batch_size=1))
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    env = dict(os.environ)
    if "ASAN_OPTIONS" in env:  # (AddressSanitizer keeps freed memory resident in a 256 MiB quarantine)
        env["ASAN_OPTIONS"] += ":quarantine_size_mb=1"
    process = Served(
        tmp_path_factory.mktemp("budget"), MODELS, "--http", "127.0.0.1:0", "--max-buffered-bytes", str(BUDGET), env=env
    )
    assert process.http_port, "".join(process.lines)
    process.keep_reading()
    yield process
    process.close()
    # The floods' 400 clients (sockets, h2 connections) are garbage in reference cycles: collected
    # now, not in a collection that holds the GIL in the middle of a later module's test.
    gc.collect()


def memory_mib(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int) -> float:
    """The child's peak RSS starts again from now (Linux: "5" resets VmHWM); its RSS now, in MiB."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pytest.skip("cannot reset the peak RSS (/proc/<pid>/clear_refs)")
    return memory_mib(pid, "VmRSS")


def http_infer(port: int) -> tuple[int, dict, float]:
    """(status, JSON answer, seconds) of one inference (x = 21) over a new connection."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [21.0]}]}).encode()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v2/models/Double/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
            head, sep, rest = answer.partition(b"\r\n\r\n")
            length = re.search(rb"Content-Length: (\d+)", head) if sep else None
            if length and len(rest) >= int(length.group(1)):
                break
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(rest), time.monotonic() - started


def grpc_infer(port: int) -> tuple[float | str, float]:
    """(y, or the error's status and message; seconds) of one inference over a new channel."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), 21, np.float32))
    started = time.monotonic()
    try:
        y: float | str = float(client.infer("Double", [x], client_timeout=10).as_numpy("y")[0, 0])
    except InferenceServerException as exc:
        y = f"{exc.status()} {exc.message()}"
    finally:
        client.close()
    return y, time.monotonic() - started


def served_again(infer, ok) -> bool:
    """Once the flood is gone, a new request is answered (the refusals before it are prompt)."""

    def answered() -> bool:
        result = infer()
        assert result[-1] < 5, result  # (seconds: never a hang)
        return ok(result)

    return wait_for(answered, every=0.05)


def readable(socks: list[socket.socket], wait: float) -> list[socket.socket]:
    """Those of socks with something to read (or closed), waiting up to wait seconds (poll: any
    descriptor number)."""
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(wait * 1000)]


def http_connect(port: int) -> list[socket.socket]:
    """FLOOD clients, each having sent the head of a request that declares DECLARED bytes of body."""
    head = b"POST /v2/models/Double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % DECLARED
    clients = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(FLOOD)]
    for s in clients:
        s.sendall(head)
        s.setblocking(False)
    return clients


def http_bodies(clients: list[socket.socket]) -> tuple[dict[socket.socket, int], dict[socket.socket, bytes]]:
    """Each client sends SENT bytes of its body, CHUNK per client per round (non-blocking: a client
    the server reads no further does not hold up the others). Returns the body bytes each sent and
    what each got back."""
    sent = dict.fromkeys(clients, 0)
    got = dict.fromkeys(clients, b"")
    done: set[socket.socket] = set()  # sent all, or the server closed it
    closed: set[socket.socket] = set()  # the server closed it

    def receive(wait: float) -> bool:
        ready = readable([s for s in clients if s not in closed], wait)
        for s in ready:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            got[s] += data
            if not data:
                closed.add(s)
                done.add(s)
        return bool(ready)

    chunk = b"x" * CHUNK
    deadline = time.monotonic() + 60
    while len(done) < FLOOD and time.monotonic() < deadline:
        for s in clients:
            if s in done:
                continue
            try:
                sent[s] += s.send(chunk[: min(CHUNK, SENT - sent[s])])
            except BlockingIOError:
                pass
            except OSError:  # closed by the server (after its answer)
                done.add(s)
            if sent[s] >= SENT:
                done.add(s)
        receive(0)
    while receive(0.2):  # the answers still on their way
        pass
    return sent, got


def test_http_a_flood_of_slow_bodies_is_held_within_the_budget(served):
    """HTTP/1.1: the flood makes the server's peak memory grow by at most the budget (plus 64 KiB per
    connection and the slack), not by the 400 MiB offered; the requests whose bytes would take it
    over get 503 naming max_buffered_bytes; a request meanwhile gets its answer or a prompt 503;
    once the flood's clients leave, requests are served again."""
    pid = served.process.pid
    clients = http_connect(served.http_port)
    try:
        before = reset_peak(pid)
        started = time.monotonic()
        sent, got = http_bodies(clients)
        took = time.monotonic() - started
        peak = memory_mib(pid, "VmHWM") - before
        refused = [g for g in got.values() if g.startswith(b"HTTP/1.1 503 ")]
        print(f"HTTP: {sum(sent.values()) / MIB:.0f} MiB sent in {took:.1f} s, {len(refused)} refused, +{peak:.0f} MiB")
        assert peak < LIMIT_MIB, f"the peak RSS rose by {peak:.0f} MiB (limit {LIMIT_MIB}), {len(refused)} refused"
        status, answer, seconds = http_infer(served.http_port)  # the flood's survivors hold their bytes
        assert (status == 200 and answer["outputs"][0]["data"] == [42.0]) or (
            status == 503 and answer == {"error": HTTP_REFUSAL}
        ), (status, answer)
        assert seconds < 5
    finally:
        for s in clients:
            s.close()
    assert len(refused) + sum(g == b"" for g in got.values()) == FLOOD, {g[:40] for g in got.values()}
    assert refused and all(json.loads(g.partition(b"\r\n\r\n")[2]) == {"error": HTTP_REFUSAL} for g in refused)
    assert served_again(lambda: http_infer(served.http_port), lambda r: r[0] == 200)
    assert http_infer(served.http_port)[1]["outputs"][0]["data"] == [42.0]
    assert served.alive()


def test_grpc_a_flood_of_slow_messages_is_held_within_the_budget(served):
    """gRPC: the same flood over HTTP/2, a call each declaring a 64 MiB message: the peak memory
    grows by at most the budget (plus 64 KiB per connection and the slack); the calls whose
    messages would take it over fail with RESOURCE_EXHAUSTED naming max_buffered_bytes (the rest of
    their messages is skipped); an inference meanwhile is answered or promptly refused; after the
    flood, inferences are served."""
    pid = served.process.pid
    clients = [Raw(served.port) for _ in range(FLOOD)]
    try:
        for c in clients:
            assert c.wait(lambda e: isinstance(e, h2_events.SettingsAcknowledged), 5.0)
        sids = {}
        for c in clients:
            sid = c.conn.get_next_available_stream_id()
            c.conn.send_headers(sid, [(b":path", b"/inference.GRPCInferenceService/ModelInfer"), *REQUEST_HEADERS])
            c.conn.send_data(sid, b"\0" + DECLARED.to_bytes(4, "big"))
            c.flush()
            sids[c] = sid
        before = reset_peak(pid)
        started = time.monotonic()
        chunk, ended = b"g" * CHUNK, set()
        for _ in range(SENT // CHUNK):
            for c in clients:
                if c in ended or c.closed:
                    continue
                try:
                    c.conn.send_data(sids[c], chunk)
                except h2_exceptions.StreamClosedError:  # refused: the server ended the call
                    ended.add(c)
                c.flush()
            for sock in readable([c.sock for c in clients if not c.closed], 0):
                next(c for c in clients if c.sock is sock).pump(5.0)
        took = time.monotonic() - started
        peak = memory_mib(pid, "VmHWM") - before
        print(f"gRPC: {FLOOD * SENT / MIB:.0f} MiB offered in {took:.1f} s, {len(ended)} refused, +{peak:.0f} MiB")
        assert peak < LIMIT_MIB, f"the peak RSS rose by {peak:.0f} MiB (limit {LIMIT_MIB}), {len(ended)} refused"
        y, seconds = grpc_infer(served.port)  # the flood's survivors hold their bytes
        assert y == 42.0 or ("RESOURCE_EXHAUSTED" in y and GRPC_REFUSAL in y), y
        assert seconds < 5
        while ready := readable([c.sock for c in clients if not c.closed], 0.2):
            for sock in ready:  # the statuses still on their way
                next(c for c in clients if c.sock is sock).pump(5.0)
        statuses = [c.response(sids[c], timeout=0)[:2] for c in clients]
    finally:
        for c in clients:
            c.close()
    refused = [s for s in statuses if s == (8, GRPC_REFUSAL)]
    assert len(refused) + statuses.count((None, None)) == FLOOD, set(statuses)  # the others are still open
    assert refused
    assert served_again(lambda: grpc_infer(served.port), lambda r: r[0] == 42.0)
    assert served.alive()


# ---- the transports alone, in process ----


def test_http_the_request_over_the_budget_is_refused_after_the_answers_before_it():
    """HttpServer(max_buffered_bytes=1 MiB): a client holding 768 KiB of a body (its input buffer
    grew to 1 MiB: 960 KiB beyond its first 64 KiB) leaves room for small requests only. Another
    client's pipelined GET is answered, then its 512 KiB POST, which would take the total over,
    gets 503 and the connection closes; once the first client leaves, the gauge is back to 0 and
    the same POST is answered."""
    answered = []

    def on_request(call, method, url, headers, body, names):
        answered.append(url)
        call.respond(200, [("Content-Type", "text/plain")], [b"%d" % len(body)])

    def on_refused(call, status, message, url):
        call.respond(status, [("Content-Type", "text/plain")], [message.encode()])

    srv = _h2.HttpServer("127.0.0.1", 0, on_request, on_refused, max_buffered_bytes=1 << 20)
    try:
        holder = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        holder.sendall(b"POST /held HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (4 << 20) + b"h" * (768 << 10))
        assert wait_for(lambda: srv.stats()["incoming_bytes"] == 960 << 10), srv.stats()
        post = b"POST /big HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (512 << 10) + b"b" * (512 << 10)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /first HTTP/1.1\r\n\r\n" + post + b"GET /after HTTP/1.1\r\nConnection: close\r\n\r\n")
            got = read_all(s)
        first, _, refusal = got.partition(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(b"\r\n\r\n0"), got
        message = b"the server holds more than 1048576 bytes of incoming requests (max_buffered_bytes); retry later"
        assert refusal.endswith(b"\r\n\r\n" + message) and b"Connection: close" in refusal, got
        assert answered == ["/first"] and srv.stats()["budget_refusals"] == 1
        holder.close()
        assert wait_for(lambda: srv.stats()["incoming_bytes"] == 0), srv.stats()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(post.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n", 1))
            got = read_all(s)
        assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(b"\r\n\r\n%d" % (512 << 10)), got
        assert srv.stats()["incoming_bytes"] == 0
    finally:
        srv.stop(0)


def test_http_a_refused_client_that_never_closes_is_closed_after_the_linger():
    """After a refusal the server reads what the client still sends into nothing (a lingering
    close), for at most 2 s: a client that keeps sending, or keeps the connection open, is then
    closed, and what it sent held nothing."""
    srv = _h2.HttpServer("127.0.0.1", 0, lambda *a: None, lambda call, status, message, url: call.respond(
        status, [("Content-Type", "text/plain")], [message.encode()]), max_body_bytes=1024)  # fmt: skip
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /x HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (1 << 30))
            assert s.recv(4096).startswith(b"HTTP/1.1 413")
            started = time.monotonic()
            while srv.stats()["connections"] and time.monotonic() - started < 10:
                s.sendall(b"b" * 4096)  # (the rest of its body, never all of it)
                time.sleep(0.05)
            lingered = time.monotonic() - started
            assert srv.stats()["connections"] == 0 and srv.stats()["incoming_bytes"] == 0
        assert 1.5 <= lingered <= 4.0, lingered
    finally:
        srv.stop(0)


def test_grpc_the_call_over_the_budget_fails_and_the_others_go_on():
    """Server(max_incoming_bytes=1 MiB), GrpcOptions.max_buffered_bytes: a client holding all but a
    byte of a 1 MiB message fills the budget, though it is far within its own connection's bound
    (GrpcLimits.max_buffered_bytes, 64 MiB). Another client's call then fails
    with RESOURCE_EXHAUSTED naming the limit, and its connection goes on: once the first call is
    reset, the gauge is back to 0 and the same call is answered."""
    handler = Handler()
    srv = _h2.Server("127.0.0.1", 0, handler, MAX_MSG, None, None, max_incoming_bytes=1 << 20)
    try:
        holder = Raw(srv.port)
        holder.wait(lambda e: isinstance(e, h2_events.SettingsAcknowledged), 3.0)
        sid = holder.request("Echo", None, end=False)
        holder.conn.send_data(sid, b"\0" + (1 << 20).to_bytes(4, "big") + b"h" * (512 << 10))
        holder.conn.send_data(sid, b"h" * ((512 << 10) - 1))  # all of its 1 MiB message but a byte
        holder.flush()
        assert wait_for(lambda: srv.stats()["incoming_bytes"] >= (1 << 20) - 1), srv.stats()
        assert (1 << 20) - 1 <= srv.stats()["incoming_bytes"] <= 1 << 20
        other = Raw(srv.port)
        other.wait(lambda e: isinstance(e, h2_events.SettingsAcknowledged), 3.0)
        message = (
            "the server holds more than 1048576 bytes of incoming request messages (max_buffered_bytes); retry later"
        )
        assert other.call("Echo", b"o" * (32 << 10))[:2] == (8, message)
        assert srv.stats()["budget_refusals"] == 1 and handler.messages == []
        holder.conn.reset_stream(sid, error_code=8)
        holder.flush()
        assert wait_for(lambda: srv.stats()["incoming_bytes"] == 0), srv.stats()
        assert not other.closed and other.call("Echo", b"o" * (32 << 10))[:3:2] == (0, b"o" * (32 << 10))
        assert srv.stats()["incoming_bytes"] == 0
    finally:
        srv.stop(0)
