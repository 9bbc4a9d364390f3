"""OpenAI's routes (``serve_http(openai=True)``) through the real ``openai`` client, sync and
async, plus ``curl -N`` and raw sockets for the Server-Sent Events; and the bound models as
ordinary Triton models (in process)."""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai")

from embedtriton import DynamicBatcher, ModelConfig, Server  # noqa: E402
from embedtriton.openai import Chunk, bind_chat, bind_completion, bind_embedding  # noqa: E402

DIM = 4


class State:
    def __init__(self) -> None:
        self.params: list[dict] = []
        self.batches: list[int] = []
        self.closed = threading.Event()
        self.async_closed = threading.Event()


@pytest.fixture(scope="module")
def served():
    state = State()

    def echo(messages, **params):
        state.params.append(params)
        for word in messages[-1]["content"].split():
            yield word + " "

    async def shout(messages, **params):
        for word in messages[-1]["content"].split():
            await asyncio.sleep(0)
            yield word.upper()

    def reported(messages, **params):
        yield Chunk("a", prompt_tokens=11)
        yield Chunk("b", completion_tokens=7, finish_reason="length")

    def boom(messages, **params):
        raise ValueError("the tokenizer broke")
        yield ""

    def endless(messages, **params):
        try:
            while True:
                time.sleep(0.01)
                yield "tick "
        finally:
            state.closed.set()

    async def endless_async(messages, **params):
        try:
            while True:
                await asyncio.sleep(0.01)
                yield "tock "
        finally:
            state.async_closed.set()

    def embed(texts):
        state.batches.append(len(texts))
        time.sleep(0.02)
        return np.array([[len(t), t.count(" "), 1.0, -1.0] for t in texts], np.float32)

    server = Server()
    bind_chat(server, "echo", echo)
    bind_chat(server, "shout", shout)
    bind_chat(server, "fixed", lambda messages, **p: "a whole answer")
    bind_chat(server, "reported", reported)
    bind_chat(server, "boom", boom)
    bind_chat(server, "endless", endless)
    bind_chat(server, "endless-async", endless_async)
    bind_completion(server, "reverse", lambda prompt, **p: prompt[::-1])
    bind_embedding(server, "unbatched", lambda texts: np.full((len(texts), 2), len(texts)), ModelConfig(batching=False))
    bind_embedding(
        server,
        "embed",
        embed,
        ModelConfig(max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=20000)),
    )
    with server:
        port = server.serve_http("127.0.0.1:0", openai=True)
        yield server, port, state


def client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)


def aclient(port: int) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)


USER = [{"role": "user", "content": "hello big world"}]


def test_models_list(served):
    _, port, _ = served
    ids = [m.id for m in client(port).models.list()]
    assert ids == sorted(
        ["echo", "shout", "fixed", "reported", "boom", "endless", "endless-async", "reverse", "embed", "unbatched"]
    )
    assert client(port).models.retrieve("echo").owned_by == "embedtriton"
    with pytest.raises(openai.NotFoundError):
        client(port).models.retrieve("nope")


def test_chat_completion(served):
    _, port, state = served
    answer = client(port).chat.completions.create(
        model="echo", messages=USER, max_tokens=5, temperature=0.5, top_p=0.9, stop=["x"], seed=3
    )
    assert answer.object == "chat.completion" and answer.model == "echo"
    assert answer.choices[0].message.content == "hello big world "
    assert answer.choices[0].message.role == "assistant" and answer.choices[0].finish_reason == "stop"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (3, 3, 6)
    assert state.params[-1] == {"max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "stop": ["x"], "seed": 3}
    # extra fields reach the callable as keyword arguments
    client(port).chat.completions.create(model="echo", messages=USER, extra_body={"top_k": 4})
    assert state.params[-1] == {"top_k": 4}
    assert client(port).chat.completions.create(model="fixed", messages=USER).choices[0].message.content == (
        "a whole answer"
    )


def test_chat_n_choices(served):
    _, port, _ = served
    answer = client(port).chat.completions.create(model="echo", messages=USER, n=3)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert {c.message.content for c in answer.choices} == {"hello big world "}
    assert answer.usage.completion_tokens == 9


def test_reported_usage_and_finish_reason(served):
    _, port, _ = served
    answer = client(port).chat.completions.create(model="reported", messages=USER)
    assert answer.choices[0].message.content == "ab" and answer.choices[0].finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (11, 7)


def test_chat_stream(served):
    _, port, _ = served
    chunks = list(
        client(port).chat.completions.create(
            model="echo", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "hello big world "
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1
    # without include_usage: no usage chunk
    chunks = list(client(port).chat.completions.create(model="echo", messages=USER, stream=True))
    assert all(c.choices for c in chunks)


def test_completion_plain_and_streamed(served):
    _, port, _ = served
    answer = client(port).completions.create(model="reverse", prompt="abc def")
    assert answer.object == "text_completion" and answer.choices[0].text == "fed cba"
    assert answer.usage.prompt_tokens == 2
    parts = list(client(port).completions.create(model="reverse", prompt="xyz", stream=True))
    assert "".join(p.choices[0].text for p in parts) == "zyx" and parts[-1].choices[0].finish_reason == "stop"


def test_embeddings(served):
    _, port, _ = served
    answer = client(port).embeddings.create(model="embed", input=["a b", "hello"])  # (the client asks for base64)
    assert [d.index for d in answer.data] == [0, 1]
    assert answer.data[0].embedding == [3.0, 1.0, 1.0, -1.0] and answer.data[1].embedding == [5.0, 0.0, 1.0, -1.0]
    answer = client(port).embeddings.create(model="embed", input="one", encoding_format="float", dimensions=2)
    assert answer.data[0].embedding == [3.0, 0.0] and answer.usage.prompt_tokens == 1
    answer = client(port).embeddings.create(model="unbatched", input=["a", "b", "c"])  # one text per call
    assert [d.embedding for d in answer.data] == [[1.0, 1.0]] * 3


def test_embeddings_are_batched_across_clients(served):
    _, port, state = served
    before = len(state.batches)
    results: list = []

    def ask(i: int) -> None:
        results.append(client(port).embeddings.create(model="embed", input=f"text {i}").data[0].embedding[0])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(float(len(f"text {i}")) for i in range(12))
    assert max(state.batches[before:]) > 1, state.batches[before:]


def test_async_client(served):
    _, port, state = served

    async def main() -> None:
        api = aclient(port)
        answer = await api.chat.completions.create(model="shout", messages=USER)
        assert answer.choices[0].message.content == "HELLOBIGWORLD"
        stream = await api.chat.completions.create(model="shout", messages=USER, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        assert text == "HELLOBIGWORLD"
        before = len(state.batches)
        answers = await asyncio.gather(*(api.embeddings.create(model="embed", input=f"t{i}") for i in range(16)))
        assert [a.data[0].embedding[0] for a in answers] == [float(len(f"t{i}")) for i in range(16)]
        assert max(state.batches[before:]) > 1
        with pytest.raises(openai.NotFoundError):
            await api.chat.completions.create(model="nope", messages=USER)
        await api.close()

    asyncio.run(main())


def test_error_classes(served):
    _, port, _ = served
    api = client(port)
    with pytest.raises(openai.NotFoundError) as caught:
        api.chat.completions.create(model="nope", messages=USER)
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="echo", messages=USER, temperature=7)
    assert caught.value.body["param"] == "temperature" and "from 0 to 2" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        api.chat.completions.create(model="echo", messages=[])
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        api.chat.completions.create(model="embed", messages=USER)
    with pytest.raises(openai.BadRequestError, match="token ids"):
        api.embeddings.create(model="embed", input=[[1, 2, 3]])
    with pytest.raises(openai.InternalServerError, match="the tokenizer broke") as caught:
        api.chat.completions.create(model="boom", messages=USER)
    assert caught.value.body["type"] == "server_error"
    with pytest.raises(openai.InternalServerError, match="the tokenizer broke"):
        list(api.chat.completions.create(model="boom", messages=USER, stream=True))


def test_client_leaving_mid_stream_closes_the_generator(served):
    _, port, state = served
    state.closed.clear()
    stream = client(port).chat.completions.create(model="endless", messages=USER, stream=True)
    seen = 0
    for _chunk in stream:
        seen += 1
        if seen == 5:
            break
    stream.close()
    assert state.closed.wait(10), "the callable's generator was not closed after the client left"
    # an async generator, left by an AsyncOpenAI stream
    state.async_closed.clear()

    async def main() -> None:
        api = aclient(port)
        stream = await api.chat.completions.create(model="endless-async", messages=USER, stream=True)
        async for _chunk in stream:
            break
        await stream.close()
        await api.close()

    asyncio.run(main())
    assert state.async_closed.wait(10), "the async generator was not closed after the client left"


def test_raw_socket_stream_and_disconnect(served):
    _, port, state = served
    state.closed.clear()
    body = json.dumps({"model": "endless", "messages": USER, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    got = b""
    while got.count(b"tick") < 3:
        got += sock.recv(65536)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Type: text/event-stream" in got
    sock.close()
    assert state.closed.wait(10)


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_stream(served):
    _, port, _ = served
    body = json.dumps({"model": "echo", "messages": USER, "stream": True})
    out = subprocess.run(
        ["curl", "-N", "-s", "-H", "Content-Type: application/json", "-d", body,
         f"http://127.0.0.1:{port}/v1/chat/completions"],
        capture_output=True, timeout=30, check=True,
    ).stdout.decode()  # fmt: skip
    events = [e for e in out.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "hello big world "


def test_bound_models_are_ordinary_triton_models(served):
    server, port, _ = served
    messages = np.array([[json.dumps(USER).encode()]], object)
    params = np.array([[b'{"max_tokens": 2}']], object)
    parts = list(server.model("echo").stream({"messages": messages, "parameters": params}))
    assert [p["text"][0, 0] for p in parts] == [b"hello ", b"big ", b"world "]
    config = server.model("echo").config()
    assert config["model_transaction_policy"]["decoupled"] is True and config["instance_group"][0]["count"] == 8
    out = server.model("embed").infer({"text": np.array([[b"ab"], [b"c"]], object)})
    assert out["embedding"].shape == (2, DIM)
    # the KServe-v2 routes serve it too
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(
        "POST",
        "/v2/models/embed/infer",
        json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["xyz"]}]}),
    )
    answer = json.loads(conn.getresponse().read())
    assert answer["outputs"][0]["data"] == [3.0, 0.0, 1.0, -1.0]


def test_openai_routes_are_off_unless_asked():
    server = Server()
    bind_completion(server, "reverse", lambda prompt, **p: prompt[::-1])
    with server:
        port = server.serve_http("127.0.0.1:0")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/v1/models")
        answer = conn.getresponse()
        assert answer.status == 404 and "no such endpoint" in json.loads(answer.read())["error"]


def test_api_key_restriction_and_draining():
    server = Server()
    bind_completion(server, "reverse", lambda prompt, **p: prompt[::-1])
    with server:
        port = server.serve_http(
            "127.0.0.1:0", openai=True, openai_api_key="s3cret", restricted_api="openai:x-team=blue"
        )
        base = f"http://127.0.0.1:{port}/v1"
        good = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0, default_headers={"x-team": "blue"})
        assert good.completions.create(model="reverse", prompt="ab").choices[0].text == "ba"
        wrong_key = openai.OpenAI(base_url=base, api_key="nope", max_retries=0, default_headers={"x-team": "blue"})
        with pytest.raises(openai.AuthenticationError) as caught:
            wrong_key.completions.create(model="reverse", prompt="ab")
        assert caught.value.body["code"] == "invalid_api_key"
        no_header = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0)
        with pytest.raises(openai.PermissionDeniedError) as caught:
            no_header.models.list()
        assert "expecting header 'x-team'" in caught.value.body["message"]
        server.endpoint("http").drain()
        with pytest.raises(openai.InternalServerError) as caught:  # 503
            good.completions.create(model="reverse", prompt="ab")
        assert caught.value.status_code == 503 and caught.value.body["type"] == "service_unavailable"


def test_stream_with_several_choices(served):
    _, port, _ = served
    chunks = list(client(port).chat.completions.create(model="echo", messages=USER, n=2, stream=True))
    texts = {0: "", 1: ""}
    finishes = {}
    for c in chunks:
        choice = c.choices[0]
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert texts == {0: "hello big world ", 1: "hello big world "} and finishes == {0: "stop", 1: "stop"}


def test_option_checks():
    from embedtriton import HttpOptions, InvalidArgumentError
    from embedtriton.frontends.grpc import GrpcOptions

    with pytest.raises(InvalidArgumentError, match="openai must be True or False"):
        HttpOptions(openai="yes")
    with pytest.raises(InvalidArgumentError, match="openai_api_key must be a non-empty string"):
        HttpOptions(openai=True, openai_api_key="")
    assert "s3cret" not in repr(HttpOptions(openai=True, openai_api_key="s3cret"))
    assert HttpOptions(restricted_api="openai,inference:k=v").restrictions.groups == {"openai": "k", "inference": "k"}
    with pytest.raises(InvalidArgumentError, match="unknown restricted protocol 'openai'"):
        GrpcOptions(restricted_protocol="openai:k=v")
    server = Server()
    with pytest.raises(InvalidArgumentError, match="config must be a ModelConfig"):
        bind_chat(server, "x", lambda m: "", config={"max_batch_size": 2})
    with pytest.raises(InvalidArgumentError, match="fn must be callable"):
        bind_embedding(server, "x", "not a function")
    with pytest.raises(InvalidArgumentError, match="neither decoupled nor a sequence model"):
        bind_embedding(server, "x", lambda t: t, ModelConfig(decoupled=True))


CLI_MODELS = """
from embedtriton.openai import bind_completion

def bind(server):
    bind_completion(server, "reverse", lambda prompt, **params: prompt[::-1])
"""


def test_serve_cli_with_openai_and_a_key_from_the_environment(tmp_path):
    import os
    import re
    import sys

    (tmp_path / "cli_models.py").write_text(CLI_MODELS)
    env = {**os.environ, "EMBEDTRITON_OPENAI_API_KEY": "from-env"}
    command = [sys.executable, "-m", "embedtriton", "serve", "cli_models:bind", "--grpc", "", "--metrics", ""]
    process = subprocess.Popen(
        [*command, "--http", "127.0.0.1:0", "--openai"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.stderr is not None:
            lines.append(process.stderr.readline())
            if "ready:" in lines[-1] or not lines[-1]:
                break
        found = re.search(r"serving HTTP on .* \(port (\d+)\)", "".join(lines))
        assert found, "".join(lines)
        base = f"http://127.0.0.1:{found.group(1)}/v1"
        keyed = openai.OpenAI(base_url=base, api_key="from-env", max_retries=0)
        assert keyed.completions.create(model="reverse", prompt="abc").choices[0].text == "cba"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="other", max_retries=0).models.list()
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


def test_over_grpc_and_in_an_ensemble():
    import queue

    grpcclient = pytest.importorskip("tritonclient.grpc")
    from embedtriton import Step, Tensor

    server = Server()
    bind_chat(server, "words", lambda messages, **p: iter(messages[-1]["content"].split()))
    bind_embedding(server, "lengths", lambda texts: np.array([[len(t)] * 2 for t in texts], np.float32))
    server.bind_ensemble(
        "embed-pipeline",
        steps=[Step("lengths", inputs={"text": "TEXT"}, outputs={"embedding": "VEC"})],
        inputs=[Tensor(name="TEXT", dtype=np.bytes_, shape=(1,))],
        outputs=[Tensor(name="VEC", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    with server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.serve_grpc('127.0.0.1:0')}")
        text = grpcclient.InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"abc"], [b"de"]], dtype=np.object_))
        np.testing.assert_array_equal(client.infer("embed-pipeline", [text]).as_numpy("VEC"), [[3, 3], [2, 2]])
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        messages = grpcclient.InferInput("messages", [1, 1], "BYTES")
        messages.set_data_from_numpy(np.array([[json.dumps(USER).encode()]], dtype=np.object_))
        client.async_stream_infer("words", [messages], enable_empty_final_response=True)
        words = []
        while True:
            result, error = results.get(timeout=10)
            assert error is None
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            words.append(result.as_numpy("text")[0, 0])
        client.stop_stream()
        assert words == [b"hello", b"big", b"world"]


def test_streams_run_at_once_and_a_batching_config_steps_a_batch():
    from embedtriton import DynamicBatcher

    running, most = [0], [0]
    lock = threading.Lock()

    def slow(messages, **params):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            for word in messages[-1]["content"].split():
                time.sleep(0.05)
                yield word
        finally:
            with lock:
                running[0] -= 1

    server = Server()
    bind_chat(server, "slow", slow)  # 8 instances
    config = ModelConfig(max_batch_size=4, batcher=DynamicBatcher(max_queue_delay_microseconds=100_000))
    bind_chat(server, "batched", lambda messages, **p: iter(messages[-1]["content"].split()), config)
    with server:
        port = server.serve_http("127.0.0.1:0", openai=True)
        answers: dict = {}

        def ask(model: str, i: int) -> None:
            words = " ".join(f"w{i}" for _ in range(i + 1))
            answer = client(port).chat.completions.create(model=model, messages=[{"role": "user", "content": words}])
            answers[model, i] = answer.choices[0].message.content

        threads = [threading.Thread(target=ask, args=(m, i)) for m in ("slow", "batched") for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert most[0] > 1, "the streams of the slow model ran one after another"
        for m in ("slow", "batched"):
            assert [answers[m, i] for i in range(4)] == [f"w{i}" * (i + 1) for i in range(4)]
        assert server.model("batched").statistics()["execution_count"] < 4  # batches of several requests
