"""The native gRPC transport (embedtriton._h2) against real grpcio clients."""

from __future__ import annotations

import gc
import glob
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import wait_for

grpc = pytest.importorskip("grpc")
_h2 = pytest.importorskip("embedtriton._h2")

MAX = 40 << 20


class Handler:
    """Echo and friends; the method name picks the behaviour."""

    def __init__(self):
        self.cancelled = []
        self.cancel_event = threading.Event()
        self.calls_seen = 0
        self.refused_compression = []  # what set_compression() raised for a Zip call, in order

    def on_message(self, call, data):
        method = call.method.rsplit("/", 1)[-1]
        if method == "Bidi":
            call.send(b"re:" + data)
        else:
            call.user = data

    def on_half_close(self, call):
        self.calls_seen += 1
        method = call.method.rsplit("/", 1)[-1]
        data = call.user or b""
        if method == "Echo":
            call.send(data)
            call.finish(0)
        elif method == "Fail":  # request: b"<code>:<message>"
            code, message = data.decode().split(":", 1)
            call.finish(int(code), message)
        elif method == "Meta":
            info = {"method": call.method, "peer": call.peer, "metadata": call.metadata}
            call.send(repr(info).encode())
            call.finish(0)
        elif method == "Sized":  # reply with that many bytes
            ok = call.send(b"z" * int(data))
            call.finish(0)
            call.user = ok
        elif method == "Stream":  # server streaming: n replies
            for i in range(int(data)):
                call.send(b"part%d" % i)
            call.finish(0)
        elif method == "Bidi":
            call.finish(0, "bidi done")
        elif method == "Zip":  # echo, the reply compressed with the algorithm x-compress names
            algorithm = dict(call.metadata)["x-compress"]
            call.set_compression(algorithm)
            call.send(data)
            call.set_compression(algorithm)  # no change: still fine
            for late in ("identity" if algorithm != "identity" else "gzip", "br", b"gzip"):
                try:
                    call.set_compression(late)
                except (RuntimeError, ValueError, TypeError) as exc:
                    self.refused_compression.append(type(exc).__name__)
            call.finish(0)
        elif method == "Later":  # answer from another thread after a delay

            def later():
                time.sleep(0.2)
                call.send(b"later:" + data)
                call.finish(0)

            threading.Thread(target=later).start()
        elif method == "Hang":
            pass  # never finishes; the client cancels or the server stops
        else:
            call.finish(12, f"unknown method {call.method}")

    def on_cancel(self, call):
        self.cancelled.append(call)
        self.cancel_event.set()


@pytest.fixture(scope="module")
def handler():
    return Handler()


@pytest.fixture(scope="module")
def server(handler):
    srv = _h2.Server("127.0.0.1", 0, handler, MAX, None, None)
    yield srv
    srv.stop(1.0)


def make_channel(port):
    return grpc.insecure_channel(
        f"127.0.0.1:{port}",
        options=[("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)],
    )


@pytest.fixture(scope="module")
def channel(server):
    ch = make_channel(server.port)
    yield ch
    ch.close()


def unary(channel, method):
    return channel.unary_unary(f"/x.Y/{method}", request_serializer=None, response_deserializer=None)


def live_calls():
    return sum(1 for o in gc.get_objects() if type(o) is _h2.Call)


def test_unary_echo(channel):
    assert unary(channel, "Echo")(b"hello", timeout=5) == b"hello"
    assert unary(channel, "Echo")(b"", timeout=5) == b""


def test_method_metadata_and_peer(channel):
    info = eval(unary(channel, "Meta")(b"", metadata=[("traceparent", "00-abc-01"), ("x-k", "v")], timeout=5))
    assert info["method"] == "/x.Y/Meta"
    assert info["peer"].startswith("ipv4:127.0.0.1:")
    md = dict(info["metadata"])
    assert md["traceparent"] == "00-abc-01" and md["x-k"] == "v"
    assert md["content-type"].startswith("application/grpc")
    assert "user-agent" in md and not any(k.startswith(":") for k in md)


def test_unknown_method_reaches_handler(channel):
    with pytest.raises(grpc.RpcError) as err:
        unary(channel, "Nope")(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.value.details() == "unknown method /x.Y/Nope"


@pytest.mark.parametrize("size", [1 << 20, 32 << 20])
def test_large_messages(channel, size):
    data = os.urandom(1024) * (size // 1024)
    assert unary(channel, "Echo")(data, timeout=30) == data


def test_oversize_request(channel):
    with pytest.raises(grpc.RpcError) as err:
        unary(channel, "Echo")(b"a" * (MAX + 1), timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in err.value.details()
    assert unary(channel, "Echo")(b"still fine", timeout=5) == b"still fine"


def test_oversize_response(channel):
    with pytest.raises(grpc.RpcError) as err:
        unary(channel, "Sized")(str(MAX + 1).encode(), timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "response message larger than max" in err.value.details()


@pytest.mark.parametrize("message", ["plain", "100% bad: ünïcødé ✓ \t tab\nnewline", "%41 stays literal"])
def test_error_status_round_trips(channel, message):
    with pytest.raises(grpc.RpcError) as err:
        unary(channel, "Fail")(f"3:{message}".encode(), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == message


def test_trailers_only_without_message(channel):
    with pytest.raises(grpc.RpcError) as err:
        unary(channel, "Fail")(b"5:", timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


COMPRESSION = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}


def compressible_or_not(size):
    return os.urandom(size) if size < 1 << 20 else b"embedtriton " * (size // 12)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [0, 10, 200_000, 8 << 20])
def test_compressed_requests(server, algorithm, size):
    """grpcio's compressed requests reach the handler decompressed (grpcio sends those that compression does not
    make smaller as they are)."""
    data = compressible_or_not(size)
    options = [("grpc.max_receive_message_length", MAX)]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", options, compression=COMPRESSION[algorithm]) as ch:
        assert unary(ch, "Echo")(data, timeout=30) == data


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [0, 10, 200_000, 8 << 20])
def test_compressed_replies(server, handler, algorithm, size):
    """set_compression() compresses the replies, which grpcio decodes: empty, small or random ones (not smaller
    compressed: sent as they are) and large ones (deflated without the GIL). It is refused after the first send()
    (for another algorithm) and for what it does not know."""
    data = compressible_or_not(size)
    handler.refused_compression.clear()
    with make_channel(server.port) as ch:
        assert unary(ch, "Zip")(data, metadata=[("x-compress", algorithm)], timeout=30) == data
    assert handler.refused_compression == ["RuntimeError", "ValueError", "TypeError"]


def test_bidi_interleaved(channel):
    requests: queue.Queue = queue.Queue()

    def gen():
        while (item := requests.get()) is not None:
            yield item

    bidi = channel.stream_stream("/x.Y/Bidi", request_serializer=None, response_deserializer=None)
    responses = bidi(gen(), timeout=30)
    for i in range(100):
        requests.put(b"m%d" % i)
        assert next(responses) == b"re:m%d" % i  # the reply arrives before the next request is sent
    requests.put(None)
    assert list(responses) == []
    assert responses.code() == grpc.StatusCode.OK


def test_server_streaming(channel):
    stream = channel.unary_stream("/x.Y/Stream", request_serializer=None, response_deserializer=None)
    assert list(stream(b"50", timeout=10)) == [b"part%d" % i for i in range(50)]


def test_send_finish_from_another_thread(channel):
    started = time.monotonic()
    assert unary(channel, "Later")(b"abc", timeout=5) == b"later:abc"
    assert time.monotonic() - started >= 0.2


def test_client_cancel_calls_on_cancel(channel, handler):
    handler.cancel_event.clear()
    before = len(handler.cancelled)
    seen = handler.calls_seen
    future = unary(channel, "Hang").future(b"wait", timeout=30)
    assert wait_for(lambda: handler.calls_seen > seen), "the call never reached the handler"
    future.cancel()
    assert handler.cancel_event.wait(5)
    call = handler.cancelled[before]
    assert call.method == "/x.Y/Hang"
    assert call.send(b"too late") is False and call.finish(0) is False


def test_concurrent_calls(channel):
    results = [None] * 64

    def worker(i):
        results[i] = [unary(channel, "Echo")(b"%d-%d" % (i, j), timeout=10) for j in range(20)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [[b"%d-%d" % (i, j) for j in range(20)] for i in range(64)]


def test_no_call_objects_leak(channel):
    for _ in range(3):
        unary(channel, "Echo")(b"warm", timeout=5)
    gc.collect()
    base = live_calls()
    for i in range(300):
        unary(channel, "Echo")(b"%d" % i, timeout=5)

    def collected():
        gc.collect()
        return live_calls() <= base

    assert wait_for(collected, every=0.05), f"{live_calls()} call objects live, {base} before"


def test_garbage_does_not_break_server(server, channel):
    for junk in (
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        os.urandom(4096),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64,
    ):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(junk)
            s.settimeout(5)
            try:
                while s.recv(4096):  # the server answers (GOAWAY) or just closes; it must not hang
                    pass
            except ConnectionResetError:
                pass
    assert unary(channel, "Echo")(b"after junk", timeout=5) == b"after junk"


def test_stop_with_pending_call_errors_client():
    h = Handler()
    srv = _h2.Server("127.0.0.1", 0, h, MAX, None, None)
    with make_channel(srv.port) as ch:
        assert unary(ch, "Echo")(b"up", timeout=5) == b"up"
        future = unary(ch, "Hang").future(b"", timeout=30)
        assert wait_for(lambda: h.calls_seen == 2), "the call never reached the handler"
        started = time.monotonic()
        srv.stop(0.3)
        assert 0.25 <= time.monotonic() - started < 5
        with pytest.raises(grpc.RpcError) as err:
            future.result(timeout=10)
        assert err.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert len(h.cancelled) == 1
        srv.stop(0)  # idempotent
        with pytest.raises(grpc.RpcError):
            unary(ch, "Echo")(b"down", timeout=2)


def test_stop_lets_calls_finish_within_grace():
    h = Handler()
    srv = _h2.Server("127.0.0.1", 0, h, MAX, None, None)
    with make_channel(srv.port) as ch:
        future = unary(ch, "Later").future(b"x", timeout=10)
        assert wait_for(lambda: h.calls_seen == 1), "the call never reached the handler"
        srv.stop(2.0)
        assert future.result(timeout=5) == b"later:x"
        assert h.cancelled == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_handler_exception_gives_internal():
    class Bad:
        def on_message(self, call, data):
            raise RuntimeError("boom")

        def on_half_close(self, call):
            call.finish(0)

        def on_cancel(self, call):
            pass

    srv = _h2.Server("127.0.0.1", 0, Bad(), MAX, None, None)
    try:
        with make_channel(srv.port) as ch:
            with pytest.raises(grpc.RpcError) as err:
                unary(ch, "Echo")(b"x", timeout=5)
            assert err.value.code() == grpc.StatusCode.INTERNAL
    finally:
        srv.stop(0)


def test_bad_arguments():
    with pytest.raises(AttributeError):
        _h2.Server("127.0.0.1", 0, object(), MAX, None, None)
    with pytest.raises(OSError):
        _h2.Server("256.1.1.1", 0, Handler(), MAX, None, None)


def _wheel_nghttp2():
    import site

    for d in [*site.getsitepackages(), *sys.path]:  # (sys.path: a wheel installed --target, on PYTHONPATH)
        found = glob.glob(os.path.join(d, "nvidia_pytriton.libs", "libnghttp2-*.so*"))
        if found:
            return found[0]
    return None


CHILD = """
import grpc, sys
from embedtriton import _h2
sys.path[:0] = [{tests!r}, {root!r}]  # test_h2, and the helpers it imports
from test_h2 import Handler, unary, make_channel
srv = _h2.Server("127.0.0.1", 0, Handler(), 1 << 20, None, {lib!r})
with make_channel(srv.port) as ch:
    assert unary(ch, "Echo")(b"old abi", timeout=5) == b"old abi"
    assert len(unary(ch, "Sized")(b"100000", timeout=5)) == 100000
srv.stop(0)
maps = open("/proc/self/maps").read()
print("wheel" if "nvidia_pytriton.libs/libnghttp2" in maps else "system")
"""


def test_wheel_bundled_nghttp2(tmp_path):
    """The transport works on the older libnghttp2 (1.4x) that the nvidia-pytriton wheel bundles."""
    lib = _wheel_nghttp2()
    if lib is None:
        pytest.skip("nvidia-pytriton wheel not installed")
    # The system library would win over libpath; a soname link to the wheel's copy, first on the search path, makes
    # the process load that one (checked through /proc/self/maps).
    (tmp_path / "libnghttp2.so.14").symlink_to(lib)
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    code = CHILD.format(tests=str(Path(__file__).parent), root=str(Path(__file__).parents[1]), lib=lib)
    # cwd elsewhere: the installed package (with its built modules) is imported, not the source tree
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "wheel"


# ---- TLS ----


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not Path("/usr/bin/openssl").exists() and subprocess.run(["which", "openssl"]).returncode != 0:
        pytest.skip("no openssl CLI")
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext", cwd=d,
        )  # fmt: skip
    return d


def tls_channel(port, certs, client_cert=False):
    ca = (certs / "ca.pem").read_bytes()
    if client_cert:
        creds = grpc.ssl_channel_credentials(
            ca, (certs / "client.key").read_bytes(), (certs / "client.pem").read_bytes()
        )
    else:
        creds = grpc.ssl_channel_credentials(ca)
    return grpc.secure_channel(f"localhost:{port}", creds)


def test_tls_call_and_plaintext_rejected(certs):
    srv = _h2.Server("127.0.0.1", 0, Handler(), MAX, (str(certs / "server.pem"), str(certs / "server.key"), None), None)
    try:
        with tls_channel(srv.port, certs) as ch:
            assert unary(ch, "Echo")(b"secret", timeout=10) == b"secret"
            data = os.urandom(1 << 20) * 4
            assert unary(ch, "Echo")(data, timeout=30) == data
        with make_channel(srv.port) as plain:
            with pytest.raises(grpc.RpcError) as err:
                unary(plain, "Echo")(b"x", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with tls_channel(srv.port, certs) as ch:  # still serving
            assert unary(ch, "Echo")(b"again", timeout=10) == b"again"
    finally:
        srv.stop(0)


def test_tls_client_certificate_required(certs):
    tls = (str(certs / "server.pem"), str(certs / "server.key"), str(certs / "ca.pem"))
    srv = _h2.Server("127.0.0.1", 0, Handler(), MAX, tls, None)
    try:
        with tls_channel(srv.port, certs) as ch:
            with pytest.raises(grpc.RpcError) as err:
                unary(ch, "Echo")(b"no cert", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with tls_channel(srv.port, certs, client_cert=True) as ch:
            assert unary(ch, "Echo")(b"with cert", timeout=10) == b"with cert"
    finally:
        srv.stop(0)


def test_tls_bad_files(certs, tmp_path):
    with pytest.raises(ValueError, match="certificate"):
        _h2.Server("127.0.0.1", 0, Handler(), MAX, (str(tmp_path / "missing.pem"), str(certs / "server.key")), None)
    with pytest.raises(ValueError, match="private key"):
        _h2.Server("127.0.0.1", 0, Handler(), MAX, (str(certs / "server.pem"), str(certs / "client.key")), None)


@pytest.mark.parametrize("grace", [0.0, 0.2])
def test_stop_under_streaming_load_ends_every_call(grace):
    """Stopping while bidi calls are in flight ends each of them; none may hang (see the GOAWAY note in native/_h2/loop.c)."""
    srv = _h2.Server("127.0.0.1", 0, Handler(), MAX, None, None)
    stop = threading.Event()
    longest = []

    def worker():
        with make_channel(srv.port) as ch:
            bidi = ch.stream_stream("/x.Y/Bidi", request_serializer=None, response_deserializer=None)
            while not stop.is_set():
                started = time.monotonic()
                try:
                    assert list(bidi(iter([b"a", b"b"]), timeout=20)) == [b"re:a", b"re:b"]
                except grpc.RpcError as e:
                    assert e.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
                longest.append(time.monotonic() - started)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    going = wait_for(lambda: len(longest) >= 2 * len(threads))  # stopped under load (asserted once they are over)
    srv.stop(grace)
    stop.set()
    for t in threads:
        t.join(15)
    assert going, "the calls never got going"
    assert not any(t.is_alive() for t in threads)
    assert max(longest) < 5
