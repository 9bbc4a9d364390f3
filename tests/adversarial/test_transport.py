"""The native HTTP/2 transport (embedtriton._h2) under hostile clients: raw frames over plain sockets, 127.0.0.1 only.

Each test states the protective behaviour it checks; all are bounded in count and time.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import site
import socket
import ssl
import subprocess
import sys
import threading
import time
import zlib

import pytest

_h2 = pytest.importorskip("embedtriton._h2")
h2_config = pytest.importorskip("h2.config")
import h2.connection  # noqa: E402
import h2.events  # noqa: E402
import h2.exceptions  # noqa: E402
import h2.settings  # noqa: E402
from serving import SANITIZED, wait_for  # noqa: E402

MAX_MSG = 4 << 20
REQUEST_HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":authority", b"localhost"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


def grpc_frame(body: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(body).to_bytes(4, "big") + body


class Handler:
    """Records what reaches the application; the method name picks the behaviour."""

    def __init__(self):
        self.lock = threading.Lock()
        self.messages = []  # method of each on_message
        self.half_closes = []
        self.cancelled = []
        self.held = []  # calls the application keeps open
        self.cancel_event = threading.Event()
        self.poured = []  # what each send() of a Pour call returned
        self.pour = None

    def _pour(self, call, count, size):
        chunk = b"z" * size
        for _ in range(count):
            ok = call.send(chunk)
            self.poured.append(ok)
            if not ok:
                break
        call.finish(0)

    def on_message(self, call, data):
        with self.lock:
            self.messages.append(call.method)
        call.user = data
        if call.method.endswith("/Block"):  # holds the IO thread, as a slow handler would
            time.sleep(float(data))

    def on_half_close(self, call):
        with self.lock:
            self.half_closes.append(call.method)
        method = call.method.rsplit("/", 1)[-1]
        if method in ("Echo", "Block"):
            call.send(call.user or b"")
            call.finish(0)
        elif method == "Size":  # the length of what arrived
            call.send(b"%d" % len(call.user or b""))
            call.finish(0)
        elif method == "Hold":
            with self.lock:
                self.held.append(call)
        elif method == "Pour":  # b"<count>:<size>": send count messages of size bytes from another thread
            count, size = map(int, call.user.split(b":"))
            pour = threading.Thread(target=self._pour, args=(call, count, size))
            pour.start()
            self.pour = pour
        else:
            call.finish(12, "unknown method")

    def on_cancel(self, call):
        with self.lock:
            self.cancelled.append(call)
        self.cancel_event.set()


@pytest.fixture
def handler():
    return Handler()


@pytest.fixture
def start(handler):
    """start(**options) -> a running _h2.Server with ``handler``; stopped after the test."""
    servers = []

    def make(tls=None, **options):
        srv = _h2.Server("127.0.0.1", 0, handler, MAX_MSG, tls, None, **options)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop(0)


class Raw:
    """An HTTP/2 client on a plain (or TLS) socket, driven frame by frame with the h2 package."""

    def __init__(self, port, preface=True, settings=None, tls_context=None, timeout=5.0):
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if tls_context is not None:
            sock = tls_context.wrap_socket(sock, server_hostname="localhost")
        self.sock = sock
        self.closed = False
        self.events = []
        cfg = h2_config.H2Configuration(client_side=True, header_encoding=None, validate_inbound_headers=False)
        self.conn = h2.connection.H2Connection(cfg)
        self.raw = not preface  # no HTTP/2 on this side: what the server sends is read and dropped
        if preface:
            self.conn.initiate_connection()
            if settings:
                self.conn.update_settings(settings)
            self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data and not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def request(self, method, body=b"", end=True, headers=(), flag=0):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(b":path", f"/x.Y/{method}".encode()), *REQUEST_HEADERS, *headers])
        if body is not None:
            data, step = grpc_frame(body, flag), self.conn.max_outbound_frame_size
            for i in range(0, max(len(data), 1), step):
                self.conn.send_data(sid, data[i : i + step], end_stream=end and i + step >= len(data))
        self.flush()
        return sid

    def pump(self, timeout):
        """Read once (up to timeout); returns the new events. Sets .closed on end of stream or reset."""
        if self.closed:
            return []
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
            return []
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return []
        if self.raw:
            return []
        try:
            new = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.closed = True
            return []
        self.events += new
        self.flush()
        return new

    def wait(self, predicate, timeout=5.0):
        """Pump until an event satisfies predicate (returns it), the connection closes, or timeout (None)."""
        deadline = time.monotonic() + timeout
        for e in self.events:
            if predicate(e):
                return e
        while not self.closed and (left := deadline - time.monotonic()) > 0:
            for e in self.pump(min(left, 0.5)):
                if predicate(e):
                    return e
        return None

    def wait_closed(self, timeout):
        """Seconds until the server closed the connection, or None if it is still open after timeout."""
        started = time.monotonic()
        self.wait(lambda e: False, timeout)
        return time.monotonic() - started if self.closed else None

    def response(self, sid, timeout=5.0):
        """(grpc-status, grpc-message, data) of one call; status None if it did not end in time."""
        ended = self.wait(
            lambda e: isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) and e.stream_id == sid, timeout
        )
        data = b"".join(e.data for e in self.events if isinstance(e, h2.events.DataReceived) and e.stream_id == sid)
        headers = {}
        for e in self.events:
            if isinstance(e, (h2.events.ResponseReceived, h2.events.TrailersReceived)) and e.stream_id == sid:
                headers.update(dict(e.headers))
        if ended is None or isinstance(ended, h2.events.StreamReset):
            return None, ended, data
        status = headers.get(b"grpc-status")
        return (int(status) if status is not None else None), headers.get(b"grpc-message", b"").decode(), data[5:]

    def call(self, method, body=b"", timeout=5.0):
        return self.response(self.request(method, body), timeout)

    def close(self):
        self.closed = True
        self.sock.close()


def _wheel_nghttp2():
    for d in site.getsitepackages():
        found = glob.glob(os.path.join(d, "nvidia_pytriton.libs", "libnghttp2-*.so*"))
        if found:
            return os.path.realpath(found[0])
    return None


LIBRARY_CHILD = """
import json, sys
from embedtriton import _h2
print(json.dumps(_h2.library(sys.argv[1] if len(sys.argv) > 1 else None)))
"""


def _library_in_child(tmp_path, *args, env=None):
    out = subprocess.run(
        [sys.executable, "-c", LIBRARY_CHILD, *args],
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,  # the installed package, not the source tree
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _library_rank(info):
    return info["reset_rate_limit"] + info["max_continuations"], tuple(map(int, info["version"].split(".")))


def test_library_choice(tmp_path):
    """The libnghttp2 with the security options, then the newer one, is used; EMBEDTRITON_NGHTTP2 forces one."""
    env = {"EMBEDTRITON_NGHTTP2": ""}
    info = _library_in_child(tmp_path, env=env)
    assert set(info) == {"path", "version", "reset_rate_limit", "max_continuations"}
    assert os.path.exists(info["path"]) and info["version"].count(".") == 2
    wheel = _wheel_nghttp2()
    if wheel is None:
        pytest.skip("nvidia-pytriton wheel not installed")
    system = info
    with_wheel = _library_in_child(tmp_path, wheel, env=env)
    wheel_info = _library_in_child(tmp_path, env={"EMBEDTRITON_NGHTTP2": wheel})
    assert wheel_info["path"] == wheel
    # Whichever of the two is better is chosen, whatever the order they were found in.
    best = max((system, wheel_info), key=_library_rank)
    assert with_wheel["path"] == best["path"]
    # A libpath that is not nghttp2 is ignored.
    assert _library_in_child(tmp_path, "/nonexistent/libnghttp2.so", env=env)["path"] == system["path"]


# ---- 4: connection cap, idle and handshake timeouts, running out of file descriptors ----


def _wait_held(handler, count):
    assert wait_for(lambda: len(handler.held) >= count), f"{len(handler.held)} of {count} calls held"
    assert len(handler.held) == count


def test_connection_cap(start, handler):
    """At max_connections a new connection gets in by closing the longest-idle one without an open call (GOAWAY,
    then close); one with a call open is never closed. When every connection has a call open, the newcomer is
    closed at once."""
    srv = start(max_connections=3)
    busy = Raw(srv.port)
    busy.request("Hold")  # open the longest, with a call open
    _wait_held(handler, 1)
    idle = [Raw(srv.port) for _ in range(2)]
    for c in idle:
        assert c.call("Echo", b"in")[0] == 0  # idle[0] is idle the longest
    newcomer = Raw(srv.port)
    started = time.monotonic()
    assert newcomer.call("Echo", b"new")[:3:2] == (0, b"new")
    assert time.monotonic() - started < 1.0
    goaway = idle[0].wait(lambda e: isinstance(e, h2.events.ConnectionTerminated), 3.0)
    assert goaway is not None and goaway.error_code == 0
    assert idle[0].wait_closed(2.0) is not None
    assert idle[1].call("Echo", b"still")[:3:2] == (0, b"still")
    assert not busy.closed and srv.stats()["evicted"] == 1
    idle[1].request("Hold")
    newcomer.request("Hold")
    _wait_held(handler, 3)
    extra = Raw(srv.port)  # every connection has a call open: no room
    closed_after = extra.wait_closed(3.0)
    assert closed_after is not None and closed_after < 1.0
    stats = srv.stats()
    assert stats["connections"] == 3 and stats["refused"] >= 1 and stats["evicted"] == 1
    for call in handler.held:
        call.send(b"done")
        call.finish(0)
    assert busy.response(1)[:3:2] == (0, b"done")
    for c in [busy, extra, newcomer, *idle]:
        c.close()


def test_idle_timeout(start, handler):
    """A connection with no open stream that sends nothing for idle_timeout gets GOAWAY and is closed; one with an
    open call is left alone."""
    srv = start(idle_timeout=0.5)
    idle = Raw(srv.port)
    busy = Raw(srv.port)
    assert idle.call("Echo", b"x")[0] == 0
    started = time.monotonic()
    sid = busy.request("Hold")
    goaway = idle.wait(lambda e: isinstance(e, h2.events.ConnectionTerminated), 3.0)
    assert goaway is not None and goaway.error_code == 0
    assert idle.wait_closed(2.0) is not None
    assert 0.4 < time.monotonic() - started < 2.5
    time.sleep(max(0.0, started + 1.0 - time.monotonic()))  # twice the idle timeout with the call open
    busy.pump(0.1)
    assert not busy.closed and not any(isinstance(e, h2.events.ConnectionTerminated) for e in busy.events)
    handler.held[0].send(b"late")
    handler.held[0].finish(0)
    assert busy.response(sid)[:3:2] == (0, b"late")
    closed_after = busy.wait_closed(3.0)  # idle once the call is over, counted from its end
    assert closed_after is not None and closed_after > 0.3
    assert srv.stats()["idle_closed"] >= 2


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("no openssl CLI")
    d = tmp_path_factory.mktemp("cert")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        cwd=d, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return d / "cert.pem", d / "key.pem"


def tls_context(cert):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(cert[0]))
    ctx.set_alpn_protocols(["h2"])
    return ctx


def test_handshake_timeout(start, cert):
    """TLS handshake plus the HTTP/2 client preface must be done within handshake_timeout, else the connection is
    closed: silent, half a preface, a TLS handshake never finished, a TLS connection that never sends its preface."""
    plain = start(handshake_timeout=0.5)
    tls = start((str(cert[0]), str(cert[1]), None), handshake_timeout=0.5)
    silent = Raw(plain.port, preface=False)
    half = Raw(plain.port, preface=False)
    half.sock.sendall(b"PRI * HTTP/2.0\r\n")
    tcp_only = Raw(tls.port, preface=False)
    tcp_only.sock.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello
    no_preface = Raw(tls.port, preface=False, tls_context=tls_context(cert))
    good = Raw(tls.port, tls_context=tls_context(cert))
    assert good.call("Echo", b"tls")[:3:2] == (0, b"tls")
    for c in (silent, half, tcp_only, no_preface):
        closed_after = c.wait_closed(3.0)
        assert closed_after is not None and closed_after < 2.0
    assert good.call("Echo", b"still")[0] == 0  # a finished preface is not timed out
    assert plain.stats()["handshake_timeouts"] == 2 and tls.stats()["handshake_timeouts"] == 2
    good.close()


FD_CHILD = """
import json, os, resource, sys
from embedtriton import _h2

class H:
    def on_message(self, call, data):
        call.user = data
    def on_half_close(self, call):
        call.send(call.user or b"")
        call.finish(0)
    def on_cancel(self, call):
        pass

srv = _h2.Server("127.0.0.1", 0, H(), 1 << 20)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 6, hard))
print(srv.port, flush=True)
for line in sys.stdin:  # one line in, the server's counters out
    print(json.dumps(srv.stats() if hasattr(srv, "stats") else {}), flush=True)
"""


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_fd_exhaustion(tmp_path):
    """With its descriptors used up (RLIMIT_NOFILE lowered in a child process) the server neither spins nor leaves
    connections hanging in the accept queue: each newcomer gets in by closing an idle connection, one that sent
    nothing first, then the longest idle, so the newest client is served; a connection with a call open keeps it, and
    so does an idle one that spoke."""
    child = subprocess.Popen(
        [sys.executable, "-c", FD_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    conns = []
    try:
        port = int(child.stdout.readline())
        busy = Raw(port)
        sid = busy.request("Echo", b"held", end=False)  # a call open (no end of stream yet) from before the flood
        spoke = Raw(port)
        assert spoke.call("Echo", b"before")[0] == 0  # idle the longest, but not silent
        for _ in range(30):  # (paced: a connection accepted in the same loop iteration as the
            conns.append(Raw(port, preface=False))  # newcomer is no candidate, so a burst that lands
            time.sleep(0.02)  # in one iteration, on a loaded machine, refuses its newest by design)

        def closed_now():
            return [c.closed or c.wait_closed(0.001) is not None for c in conns]

        # the server has dealt with the flood (made room by closing connections) before its CPU is measured; within
        # 5 s, well before the 10 s handshake timeout would close them anyway
        assert wait_for(lambda: sum(closed_now()) >= 30 - 6, 5.0), (
            f"only {sum(closed_now())} of 30 connections beyond the descriptor limit were closed"
        )
        cpu = _cpu_seconds(child.pid)
        time.sleep(1.0)
        cpu = _cpu_seconds(child.pid) - cpu
        assert cpu < 0.3, f"the server used {cpu:.2f} s of CPU in 1 s while out of descriptors"
        closed = closed_now()
        assert sum(closed) >= 30 - 6, f"only {sum(closed)} of 30 connections beyond the descriptor limit were closed"
        assert not closed[-1], "the newest connection was closed, not the longest idle"
        newest = Raw(port)
        started = time.monotonic()
        assert newest.call("Echo", b"during", timeout=3)[:3:2] == (0, b"during")
        assert time.monotonic() - started < 1.0
        busy.conn.end_stream(sid)
        busy.flush()
        assert busy.response(sid)[:3:2] == (0, b"held")
        assert spoke.call("Echo", b"after")[:3:2] == (0, b"after")
        assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in spoke.events)
        child.stdin.write("stats\n")
        child.stdin.flush()
        stats = json.loads(child.stdout.readline())
        assert stats["emfile"] > 0 and stats["evicted"] > 0
        for c in (busy, spoke, newest):
            c.close()
    finally:
        for c in conns:
            c.close()
        child.kill()
        child.wait(10)


# ---- 1: HPACK header bomb ----


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _server_settings(client):
    changed = client.wait(lambda e: isinstance(e, h2.events.RemoteSettingsChanged), 3.0)
    assert changed is not None
    return {int(k): v.new_value for k, v in changed.changed_settings.items()}


def test_header_bomb(start, handler):
    """30,000 one-byte references to a 4 KiB HPACK table entry (~120 MB of headers from ~30 KB on the wire) are
    refused with RESOURCE_EXHAUSTED naming the limit, without the server keeping them; the limit is advertised."""
    srv = start()
    bomb = Raw(srv.port, settings={h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 30})
    bomb.conn.config.validate_outbound_headers = False
    settings = _server_settings(bomb)
    before = rss_mib()
    sid = bomb.request("Echo", body=None, headers=[(b"x-bomb", b"a" * 4000)] * 30000)  # HEADERS only: stays open
    status, message, _ = bomb.response(sid, timeout=3.0)
    grown = rss_mib() - before
    assert grown < 16 or SANITIZED, f"RSS grew by {grown:.0f} MiB"
    assert status == 8 and "16384" in message, (status, message)
    assert settings.get(h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE) == 16384
    assert handler.messages == [] and handler.half_closes == []
    assert not bomb.closed and bomb.call("Echo", b"after")[:3:2] == (0, b"after")  # the connection survives


def test_header_field_count_and_option(start, handler):
    """More than 100 header fields are refused even when small; max_header_list_bytes sets the size limit."""
    client = Raw(start().port)
    many = [(b"x-k%d" % i, b"v") for i in range(120)]
    status, message, _ = client.response(client.request("Echo", headers=many))
    assert status == 8 and "100" in message, (status, message)
    fine = [(b"x-k%d" % i, b"v") for i in range(60)]
    assert client.response(client.request("Echo", b"ok", headers=fine))[:3:2] == (0, b"ok")
    small = Raw(start(max_header_list_bytes=2048).port)
    assert _server_settings(small)[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] == 2048
    status, message, _ = small.response(small.request("Echo", headers=[(b"x-big", b"b" * 2100)]))
    assert status == 8 and "2048" in message, (status, message)
    assert small.response(small.request("Echo", b"ok", headers=[(b"x-big", b"b" * 1500)]))[:3:2] == (0, b"ok")
    assert handler.half_closes == ["/x.Y/Echo"] * 2


# ---- 2: resets and disconnects ----


def _block_io_thread(client, handler, seconds):
    """Make the handler hold the IO thread for a while (as a slow on_message would), so that what other clients
    send meanwhile is read in one go afterwards."""
    sid = client.request("Block", b"%.2f" % seconds)
    # on_message records the call before it sleeps: the IO thread is then inside it
    assert wait_for(lambda: "/x.Y/Block" in handler.messages), "the Block call never reached on_message"
    return sid


def test_closed_before_dispatch_never_starts(start, handler):
    """A request whose stream was reset, or whose client closed its side, before the request was handed to the
    application never reaches on_message/on_half_close (and, with no call made, gets no on_cancel)."""
    srv = start()
    blocker, resetting, closing = Raw(srv.port), Raw(srv.port), Raw(srv.port)
    for c in (blocker, resetting, closing):  # connections set up before the IO thread is held
        assert c.call("Echo", b"up")[0] == 0
    with handler.lock:
        handler.messages.clear()
        handler.half_closes.clear()
    bsid = _block_io_thread(blocker, handler, 0.4)
    sid = resetting.request("Echo", b"reset me")
    resetting.conn.reset_stream(sid, error_code=8)
    resetting.flush()
    closing.request("Echo", b"closing")
    closing.sock.shutdown(socket.SHUT_WR)
    assert blocker.response(bsid)[0] == 0
    # Barriers instead of a pause: the server closes `closing` once it has read its end (after dispatching what
    # came before it), and answers `next` only after the reset stream's frames, read before it on that connection.
    assert closing.wait_closed(10.0) is not None, "the server did not close the connection its client closed"
    assert resetting.call("Echo", b"next")[:3:2] == (0, b"next")  # the connection itself is fine
    assert handler.messages == ["/x.Y/Block", "/x.Y/Echo"] and handler.half_closes == ["/x.Y/Block", "/x.Y/Echo"]
    assert handler.cancelled == []


def test_open_calls_are_cancelled(start, handler):
    """Every call the application holds gets on_cancel when its stream is reset or its connection goes, whether its
    half-close was dispatched (unary) or not (a stream still sending); send/finish then return False."""
    srv = start()
    a, b = Raw(srv.port), Raw(srv.port)
    reset_sid = a.request("Hold", b"unary, reset")
    b.request("Hold", b"unary, disconnected")
    b.request("Hold", b"streaming, disconnected", end=False)
    assert wait_for(lambda: len(handler.held) >= 2 and len(handler.messages) >= 3), (handler.held, handler.messages)
    assert len(handler.held) == 2 and len(handler.messages) == 3
    a.conn.reset_stream(reset_sid, error_code=8)
    a.flush()
    b.close()
    assert wait_for(lambda: len(handler.cancelled) >= 3), f"{len(handler.cancelled)} of 3 calls cancelled"
    assert len(handler.cancelled) == 3
    for call in handler.cancelled:
        assert call.send(b"late") is False and call.finish(0) is False
    assert a.call("Echo", b"a lives")[0] == 0


# ---- 3: one fast TLS sender ----


def _tiny_tls_records(port, cert, payload):
    """A TLS connection (socket, handshake done, HTTP/2 preface sent) and payload encrypted as one-byte records:
    each record costs the server two reads and a decryption, so it cannot keep up with the sender."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = tls_context(cert).wrap_bio(incoming, outgoing, server_hostname="localhost")
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            sock.sendall(outgoing.read())
            incoming.write(sock.recv(65536))
    client = h2.connection.H2Connection(h2_config.H2Configuration(client_side=True))
    client.initiate_connection()
    tls.write(client.data_to_send())
    sock.sendall(outgoing.read())
    for i in range(len(payload)):
        tls.write(payload[i : i + 1])
    return sock, outgoing.read()


def test_fast_tls_sender_does_not_starve_others(start, cert):
    """A TLS client sending more than the server can read (1.5 million one-byte records of WINDOW_UPDATE frames,
    which no flow control stops) gets a bounded share of each loop iteration; a call on another connection still
    answers promptly."""
    srv = start((str(cert[0]), str(cert[1]), None))
    normal = Raw(srv.port, tls_context=tls_context(cert))
    assert normal.call("Echo", b"before")[0] == 0
    window_update = (4).to_bytes(3, "big") + b"\x08\x00" + (0).to_bytes(4, "big") + (1).to_bytes(4, "big")
    sock, flood = _tiny_tls_records(srv.port, cert, (window_update * 120000)[:1500000])
    thread = threading.Thread(target=sock.sendall, args=(flood,))
    thread.start()
    try:
        time.sleep(0.1)  # the flood under way: the server counts no bytes read that a poll could watch
        worst = 0.0
        for i in range(5):
            started = time.monotonic()
            assert normal.call("Echo", b"%d" % i, timeout=5.0)[:3:2] == (0, b"%d" % i)
            worst = max(worst, time.monotonic() - started)
        flooding = thread.is_alive()
        thread.join(30)
    finally:
        sock.close()
    assert worst < 0.5, f"a call took {worst:.2f} s during the flood"
    assert flooding, "the flood was read before the calls were made"


# ---- 2c: rapid reset ----


def _open_and_reset(client, n, method="Hold", gap=0.0):
    """Open n calls on client (complete requests), then reset them all; with a gap, the requests are read (and
    dispatched) before the resets arrive. Returns False once the connection is over."""
    conn = client.conn
    try:
        sids = []
        for _ in range(n):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, [(b":path", f"/x.Y/{method}".encode()), *REQUEST_HEADERS])
            conn.send_data(sid, grpc_frame(b"r"), end_stream=True)
            sids.append(sid)
        if gap:
            client.flush()
            time.sleep(gap)
        for sid in sids:
            conn.reset_stream(sid, error_code=8)
        client.flush()
    except h2.exceptions.ProtocolError:  # the server said GOAWAY
        return False
    client.pump(0)
    return not client.closed and not any(isinstance(e, h2.events.ConnectionTerminated) for e in client.events)


def test_rapid_reset_flood_is_cut_off(start, handler):
    """A connection resetting calls as fast as it opens them gets GOAWAY once it used nghttp2's burst (1000) plus
    500/s; a call on another connection answers promptly meanwhile."""
    srv = start()
    flood, normal = Raw(srv.port), Raw(srv.port)
    assert normal.call("Echo", b"up")[0] == 0
    started = time.monotonic()
    resets, worst = 0, 0.0
    while resets < 5000 and time.monotonic() - started < 8:
        # half of the batches are dispatched before their resets arrive: those reach the handler
        if not _open_and_reset(flood, 100, gap=0.01 if resets % 200 else 0.0):
            break
        resets += 100
        if resets % 500 == 0:
            t = time.monotonic()
            assert normal.call("Echo", b"%d" % resets, timeout=3.0)[0] == 0
            worst = max(worst, time.monotonic() - t)
    elapsed = time.monotonic() - started
    assert resets < 5000, f"{resets} resets in {elapsed:.1f} s and the connection is still open"
    assert resets <= 1000 + 500 * (elapsed + 1) + 200
    # GOAWAY, then the close (the GOAWAY itself may be lost to a reset if the server closes with requests unread)
    assert flood.wait_closed(3.0) is not None
    assert worst < 0.5, f"a call on another connection took {worst:.2f} s"
    assert normal.call("Echo", b"after")[0] == 0


def test_busy_client_cancelling_is_not_dropped(start, handler):
    """A client that cancels 400 calls a second for 3 s (1200 resets, past the burst) keeps its connection."""
    srv = start()
    client = Raw(srv.port)
    started = time.monotonic()
    for i in range(30):
        time.sleep(max(0.0, started + i * 0.1 - time.monotonic()))
        assert _open_and_reset(client, 40, gap=0.005), f"dropped after {i * 40} cancels"
    assert client.call("Echo", b"still here")[:3:2] == (0, b"still here")
    assert len(handler.cancelled) >= 1000  # they reached the application and were cancelled there


# ---- 5: back-pressure on responses ----


def test_zero_window_client_bounded(start, handler):
    """A client that opens no flow-control window while the application sends 128 x 1 MiB: the server buffers at
    most half of max_buffered_bytes (64 MiB) for the stream, then resets it (ENHANCE_YOUR_CALM), send() returns
    False, and the application gets on_cancel."""
    srv = start()
    client = Raw(srv.port, settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    client.wait(lambda e: isinstance(e, h2.events.SettingsAcknowledged), 3.0)
    before = rss_mib()
    sid = client.request("Pour", b"128:1048576")
    assert wait_for(lambda: handler.pour is not None), "the Pour call never reached the application"
    handler.pour.join(10)
    grown = rss_mib() - before
    assert grown < 48 or SANITIZED, f"RSS grew by {grown:.0f} MiB"
    assert False in handler.poured and handler.poured.index(False) <= 33, handler.poured.count(True)
    assert handler.cancel_event.wait(3.0)
    reset = client.wait(lambda e: isinstance(e, h2.events.StreamReset) and e.stream_id == sid, 3.0)
    assert reset is not None and reset.error_code == 0xB
    assert handler.cancelled[0].send(b"more") is False
    assert srv.stats()["buffer_resets"] == 1


def test_connection_buffer_bound_and_one_message_fits(start, handler):
    """max_buffered_bytes bounds a connection's streams together; a single message larger than the bound is still
    sent when nothing else is queued."""
    srv = start(max_buffered_bytes=2 << 20)
    client = Raw(srv.port, settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    client.wait(lambda e: isinstance(e, h2.events.SettingsAcknowledged), 3.0)
    sids = [client.request("Hold", b"%d" % i) for i in range(3)]
    _wait_held(handler, 3)
    held = sorted(handler.held, key=lambda c: c.user)
    part = b"p" * (768 << 10)
    assert [c.send(part) for c in held] == [True, True, False]  # 0.75 + 0.75 MiB queued, 2.25 would be over 2
    for c in held[:2]:
        c.finish(0)
    client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
    client.conn.increment_flow_control_window(1 << 24)
    client.flush()
    for sid in sids[:2]:
        assert client.response(sid)[:3:2] == (0, part)
    reset = client.wait(lambda e: isinstance(e, h2.events.StreamReset) and e.stream_id == sids[2], 3.0)
    assert reset is not None and reset.error_code == 0xB
    big = os.urandom(3 << 20)  # over max_buffered_bytes, under max_message_bytes
    assert client.call("Echo", big, timeout=10)[:3:2] == (0, big)


# ---- incoming messages: memory follows the bytes received ----


def test_incomplete_request_messages_are_bounded(start, handler):
    """Declared message lengths are claims: a client that opens 64 calls, each declaring a 4 MiB message and sending
    a prefix or 512 KiB of it, makes the server hold at most max_buffered_bytes for that connection (beyond, the call
    fails with RESOURCE_EXHAUSTED); the connection and the others go on."""
    srv = start(max_buffered_bytes=8 << 20)
    client = Raw(srv.port)
    client.wait(lambda e: isinstance(e, h2.events.SettingsAcknowledged), 3.0)
    before = rss_mib()
    declared = (MAX_MSG).to_bytes(4, "big")
    prefix_only = []
    for _ in range(64):  # 5 bytes each, declaring 4 MiB: next to nothing is allocated
        sid = client.conn.get_next_available_stream_id()
        client.conn.send_headers(sid, [(b":path", b"/x.Y/Echo"), *REQUEST_HEADERS])
        client.conn.send_data(sid, b"\0" + declared)
        prefix_only.append(sid)
    client.flush()
    assert client.call("Echo", b"still here")[:3:2] == (0, b"still here")
    assert rss_mib() - before < 16 or SANITIZED
    halves = []
    chunk = b"h" * (16 << 10)
    for _ in range(32):  # then 512 KiB of each of 32 new calls: 16 MiB claimed against an 8 MiB bound
        sid = client.conn.get_next_available_stream_id()
        client.conn.send_headers(sid, [(b":path", b"/x.Y/Echo"), *REQUEST_HEADERS])
        client.conn.send_data(sid, b"\0" + declared)
        try:
            for _ in range(32):
                while client.conn.local_flow_control_window(sid) < len(chunk) and not client.closed:
                    client.pump(0.2)
                client.conn.send_data(sid, chunk)
                client.flush()
        except h2.exceptions.StreamClosedError:  # refused: the server ended the call
            pass
        halves.append(sid)
    statuses = [client.response(sid, timeout=5.0)[:2] for sid in halves[-8:]]
    grown = rss_mib() - before
    assert grown < 40 or SANITIZED, f"RSS grew by {grown:.0f} MiB"
    assert all(s == 8 and "incomplete request messages" in m for s, m in statuses), statuses
    other = Raw(srv.port)  # the client hurts only itself: other connections are served
    assert other.call("Echo", b"other")[:3:2] == (0, b"other")
    for sid in prefix_only + halves:  # and once it gives up its incomplete calls, it is served again
        try:
            client.conn.reset_stream(sid, error_code=8)
        except h2.exceptions.StreamClosedError:
            pass
    client.flush()
    assert not client.closed and client.call("Echo", b"after")[:3:2] == (0, b"after")
    assert handler.messages.count("/x.Y/Echo") == 3  # only the complete calls reached the application


# ---- compressed request messages ----


def _vm_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _gzip_of_zeros(size):
    """gzip of ``size`` zero bytes, made 1 MiB at a time (the zeros are never all in memory)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + 15)
    chunk = bytes(1 << 20)
    out = [z.compress(chunk) for _ in range(size >> 20)]
    return b"".join(out) + z.compress(bytes(size & ((1 << 20) - 1))) + z.flush()


GZIP = [(b"grpc-encoding", b"gzip")]


def test_decompression_bomb(start, handler):
    """64 MiB of zeros gzip-compressed to 64 KiB, against max_message_bytes of 4 MiB, eight times: each fails with
    RESOURCE_EXHAUSTED naming the limit, the server's memory peaks at about the limit (never the 64 MiB), nothing
    reaches the application and the connection goes on; a message that inflates to exactly the limit is delivered."""
    srv = start()
    client = Raw(srv.port)
    bomb = _gzip_of_zeros(64 << 20)
    assert len(bomb) < 128 << 10
    try:  # the peak of this process's memory starts again from now (Linux: "5" resets VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pytest.skip("cannot reset the peak RSS (/proc/self/clear_refs)")
    before = _vm_mib("VmRSS")
    for _ in range(8):
        status, message, _ = client.response(client.request("Echo", bomb, headers=GZIP, flag=1))
        assert status == 8, (status, message)
        assert message == f"received message after decompression larger than max (more than {MAX_MSG} bytes)"
    peak = _vm_mib("VmHWM") - before
    assert peak < 16 or SANITIZED, f"the peak RSS rose by {peak:.0f} MiB"
    assert handler.messages == []
    assert client.call("Echo", b"after")[:3:2] == (0, b"after")
    exact, over = _gzip_of_zeros(MAX_MSG), _gzip_of_zeros(MAX_MSG + 1)
    assert client.response(client.request("Size", exact, headers=GZIP, flag=1))[:3:2] == (0, b"%d" % MAX_MSG)
    assert client.response(client.request("Size", over, headers=GZIP, flag=1))[0] == 8


@pytest.mark.parametrize(
    "headers, message, status, words",
    [
        (GZIP, b"\x1f\x8bnot gzip at all", 13, "Decompression failed due to unknown compression method"),
        (GZIP, gzip.compress(b"hello world" * 100)[:-10], 13, "Decompression failed due to truncated data"),
        (GZIP, zlib.compress(b"a zlib stream"), 13, "Decompression failed due to incorrect header check"),
        (GZIP, gzip.compress(b"one") + gzip.compress(b"two"), 13, "Decompression failed due to not all input consumed"),
        ([(b"grpc-encoding", b"deflate")], gzip.compress(b"gzip as deflate"), 13, "Decompression failed due to"),
        ([], gzip.compress(b"no grpc-encoding"), 13, "Compression bit set but no encoding configured"),
        ([(b"grpc-encoding", b"identity")], b"x", 13, "Compression bit set but no encoding configured"),
        ([(b"grpc-encoding", b"br")], b"x", 12, "Compression algorithm 'br' (grpc-encoding) is not supported"),
        ([(b"grpc-encoding", b"GZIP")], b"x", 12, "Compression algorithm 'GZIP' (grpc-encoding) is not supported"),
    ],
    ids=["corrupt", "truncated", "zlib-as-gzip", "two-members", "gzip-as-deflate", "no-encoding", "identity", "br",
         "uppercase"],
)  # fmt: skip
def test_bad_compressed_messages(start, handler, headers, message, status, words):
    """A compressed message that does not decompress fails its call with INTERNAL, as does the compressed flag
    without a grpc-encoding; an encoding the server does not know is UNIMPLEMENTED, naming it and, in
    grpc-accept-encoding, those it takes. Nothing reaches the application; the connection goes on."""
    client = Raw(start().port)
    sid = client.request("Echo", message, headers=headers, flag=1)
    got, text, _ = client.response(sid)
    assert got == status and text.startswith(words), (got, text)
    accept = [dict(e.headers).get(b"grpc-accept-encoding") for e in client.events if hasattr(e, "headers")]
    assert accept == ([b"identity, deflate, gzip"] if status == 12 else [None])
    assert handler.messages == []
    assert client.call("Echo", b"after")[:3:2] == (0, b"after")


def test_unknown_encoding_is_refused_before_any_message(start, handler):
    """An unknown grpc-encoding is refused at the request's headers, even when no message is compressed."""
    client = Raw(start().port)
    status, text, _ = client.response(client.request("Echo", b"plain", headers=[(b"grpc-encoding", b"snappy")]))
    assert status == 12 and "'snappy'" in text
    assert handler.messages == [] and handler.half_closes == []
    assert client.call("Echo", b"after")[:3:2] == (0, b"after")
