"""The batch-step form of the OpenAI chat and completion models (``bind_chat(server, name,
step=fn)``: continuous batching on Triton's iterative sequence batcher), through the real
``openai`` client: what the server enforces (max tokens, stop strings never streamed, n, a
client that leaves is gone before the next iteration, max_sequences, the token budget of an
iteration), steps shared by concurrent clients, and the model as an ordinary Triton model (in
process and over gRPC streams)."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time

import numpy as np
import pytest
from helpers import wait_for

openai = pytest.importorskip("openai")

from embedtriton import Final, InvalidArgumentError, ModelConfig, SequenceBatcher, Server, Tensor  # noqa: E402
from embedtriton.openai import Chunk, Sequence, bind_chat, bind_completion  # noqa: E402

USER = [{"role": "user", "content": "say something"}]
MAX_SEQUENCES = 4


class Recorder:
    """What the step functions saw: the sequences of each iteration, and those that left."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: list[list[Sequence]] = []
        self.left: list[Sequence] = []
        self.left_states: list[dict] = []

    def record(self, seqs: list[Sequence]) -> None:
        with self.lock:
            self.steps.append(list(seqs))

    def leave(self, seq: Sequence) -> None:
        with self.lock:
            self.left.append(seq)
            self.left_states.append(dict(seq.state))

    def clear(self) -> None:
        with self.lock:
            self.steps.clear()
            self.left.clear()
            self.left_states.clear()


def words(seqs: list[Sequence], rec: Recorder, pause: float = 0.0) -> list[str]:
    """w0 w1 w2 ... for each sequence, one word per iteration, forever (the server ends them)."""
    rec.record(seqs)
    if pause:
        time.sleep(pause)
    out = []
    for seq in seqs:
        made = seq.state.get("made", 0)
        seq.state["made"] = made + 1
        out.append(f"w{made} ")
    return out


def long_prefill(seqs):
    """An iteration with a new sequence takes 1.5 s (a long prompt's prefill on a busy CPU)."""
    if any(seq.new for seq in seqs):
        time.sleep(1.5)
    return ["t"] * len(seqs)


@pytest.fixture(scope="module")
def served():
    rec = Recorder()
    slow = Recorder()

    def pieces(seqs):
        """Each sequence's params["pieces"], one per iteration, then finish_reason "stop"."""
        rec.record(seqs)
        out: list = []
        for seq in seqs:
            at = seq.state.get("at", 0)
            seq.state["at"] = at + 1
            parts = seq.params["pieces"]
            out.append(parts[at] if at < len(parts) else Chunk(finish_reason="stop"))
        return out

    async def async_words(seqs):
        await asyncio.sleep(0)
        return words(seqs, rec)

    server = Server()
    bind_chat(server, "words", step=lambda seqs: words(seqs, rec), max_sequences=MAX_SEQUENCES, on_leave=rec.leave)
    bind_chat(server, "slow", step=lambda seqs: words(seqs, slow, 0.005), max_sequences=MAX_SEQUENCES, on_leave=slow.leave)  # fmt: skip
    bind_chat(server, "pieces", step=pieces)
    bind_completion(server, "async-words", step=async_words)
    bind_chat(server, "long-prefill", step=long_prefill)
    with server:
        port = server.serve_http("127.0.0.1:0", openai=True)
        yield server, port, rec, slow


def client(port: int):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)


def test_max_tokens_ends_a_sequence_with_length(served):
    _, port, _, _ = served
    answer = client(port).chat.completions.create(model="words", messages=USER, max_tokens=5)
    assert answer.choices[0].message.content == "w0 w1 w2 w3 w4 "
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 5
    answer = client(port).chat.completions.create(model="words", messages=USER, max_completion_tokens=2)
    assert answer.choices[0].message.content == "w0 w1 " and answer.choices[0].finish_reason == "length"


def test_stop_strings_are_never_streamed(served):
    """A stop string cut across pieces: what could be its start is held back, and never sent."""
    _, port, _, _ = served
    parts = ["Hello", " wor", "ld ST", "O", "P and more", " after"]
    stream = client(port).chat.completions.create(
        model="pieces", messages=USER, stream=True, stop=["STOP", "never"], extra_body={"pieces": parts}
    )
    deltas, finish = [], None
    for chunk in stream:
        if chunk.choices:
            deltas.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(deltas) == "Hello world "
    assert not any("S" in d or "T" in d for d in deltas), deltas  # no part of "STOP" ever went out
    assert finish == "stop"
    # a held-back start that turns out not to be a stop string is sent after all
    answer = client(port).completions.create(
        model="async-words", prompt="p", max_tokens=3, stop="w1 x"
    )  # ("w1 " could start "w1 x", then "w2 " shows it does not)
    assert answer.choices[0].text == "w0 w1 w2 " and answer.choices[0].finish_reason == "length"
    # the function's own finish reason, when the pieces run out
    answer = client(port).chat.completions.create(model="pieces", messages=USER, extra_body={"pieces": ["a", "b"]})
    assert answer.choices[0].message.content == "ab" and answer.choices[0].finish_reason == "stop"


def test_n_choices_are_sequences_of_their_own(served):
    _, port, _, rec = served  # (the model whose iterations take 5 ms: the choices meet)
    rec.clear()
    answer = client(port).chat.completions.create(model="slow", messages=USER, max_tokens=5, n=3)
    assert sorted(c.index for c in answer.choices) == [0, 1, 2]
    assert all(c.message.content == "w0 w1 w2 w3 w4 " for c in answer.choices)
    assert answer.usage.completion_tokens == 15
    seen = {seq.index for step in rec.steps for seq in step}
    assert seen == {0, 1, 2}
    assert max(len(step) for step in rec.steps) == 3  # the three choices shared iterations


def test_a_client_that_leaves_is_gone_before_the_next_iteration(served):
    _, port, _, slow = served
    slow.clear()
    stream = client(port).chat.completions.create(model="slow", messages=USER, stream=True)
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
            if got == 3:
                break
    stream.close()
    assert wait_for(lambda: len(slow.left) == 1), "on_leave was not called for the sequence whose client left"
    gone = slow.left[0]
    assert slow.left_states[0]["made"] >= 3 and gone.state == {}  # its state was dropped
    with slow.lock:
        after = len(slow.steps)
    time.sleep(0.1)  # (that no iteration comes: a span of time, no state to wait for)
    with slow.lock:
        assert len(slow.steps) == after, "iterations went on with nobody left"  # (it was the only one)
        assert all(gone not in step for step in slow.steps[after:])


def test_concurrent_clients_share_iterations_and_max_sequences_holds(served):
    _, port, _, slow = served
    slow.clear()
    answers: list = []
    lengths = [2, 9, 4, 12, 3, 7, 5, 10, 1, 6, 8, 11]
    clients = [client(port) for _ in lengths]
    for c in clients:  # (connected before they start together)
        c.models.list()
    together = threading.Barrier(len(lengths))

    def ask(api, n: int) -> None:
        together.wait()
        answer = api.chat.completions.create(model="slow", messages=USER, max_tokens=n)
        answers.append((n, answer.choices[0].message.content, answer.choices[0].finish_reason))

    threads = [threading.Thread(target=ask, args=(c, n)) for c, n in zip(clients, lengths, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(answers) == sorted((n, "".join(f"w{i} " for i in range(n)), "length") for n in lengths)
    sizes = [len(step) for step in slow.steps]
    assert 2 <= max(sizes) <= MAX_SEQUENCES, sizes  # shared, and never more than max_sequences
    assert len(slow.left) == len(lengths)  # on_leave for every sequence, finished ones too
    assert len(slow.steps) < sum(lengths) / 1.5, len(slow.steps)  # fewer iterations than tokens


def test_max_sequences_run_at_once_and_the_others_wait_in_order():
    """12 streams at once in process (they all arrive during the first 20 ms iteration): 4 run,
    the others wait and join as slots free; every iteration is full until the queue runs dry."""
    rec = Recorder()
    server = Server()
    bind_chat(server, "four", step=lambda seqs: words(seqs, rec, 0.02), max_sequences=MAX_SEQUENCES)
    with server:
        model = server.model("four")
        done: list = []

        def ask(n: int) -> None:
            params = json.dumps({"max_tokens": n}).encode()
            inputs = {"messages": np.array([[json.dumps(USER).encode()]], object), "parameters": np.array([[params]], object)}  # fmt: skip
            done.append(len(list(model.stream(inputs))))

        threads = [threading.Thread(target=ask, args=(3,)) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    sizes = [len(step) for step in rec.steps]
    assert done == [3] * 12 and max(sizes) == MAX_SEQUENCES, sizes
    assert sum(sizes) == 36 and len(sizes) <= 12, sizes  # (9 full iterations, a few more if one came late)


def test_a_long_prefill_waits_for_room_in_the_step_budget():
    """max_step_tokens=10: two running sequences cost 1 each; a new one with a 20-word prompt
    would take the iteration over, so it waits until nothing else runs (then it goes alone)."""
    rec = Recorder()
    server = Server()
    bind_completion(server, "budget", step=lambda seqs: words(seqs, rec, 0.002), max_step_tokens=10)
    with server:
        model = server.model("budget")
        results: dict = {}

        def ask(key: str, prompt: str, n: int) -> None:
            params = json.dumps({"max_tokens": n}).encode()
            parts = model.stream(
                {"prompt": np.array([[prompt.encode()]], object), "parameters": np.array([[params]], object)}
            )
            results[key] = b"".join(p["text"][0, 0] for p in parts)

        short = [threading.Thread(target=ask, args=(f"short{i}", "a b", 30)) for i in range(2)]
        for t in short:
            t.start()
        assert wait_for(lambda: sum(len(s) for s in rec.steps[-1:]) == 2)
        long = threading.Thread(target=ask, args=("long", " ".join(["word"] * 20), 3))
        long.start()
        for t in [*short, long]:
            t.join(30)
    assert results == {
        "short0": results["short1"],
        "short1": b"".join(b"w%d " % i for i in range(30)),
        "long": b"w0 w1 w2 ",
    }
    for step in rec.steps:
        cost = sum(len(s.prompt.split()) if s.new else 1 for s in step)
        assert cost <= 10 or len(step) == 1, [(s.prompt, s.new) for s in step]


def test_the_model_is_an_ordinary_triton_model(served):
    """In process (model.stream, the choice index a request parameter), and over gRPC streams
    (tritonclient)."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    server, _, rec, _ = served
    rec.clear()
    inputs = {
        "messages": np.array([[json.dumps(USER).encode()]], object),
        "parameters": np.array([[b'{"max_tokens": 2}']], object),
    }
    parts = list(server.model("words").stream(inputs, parameters={"index": 4}))
    assert [p["text"][0, 0] for p in parts] == [b"w0 ", b"w1 "]
    assert parts[-1]["finish_reason"][0, 0] == b"length" and parts[-1]["completion_tokens"][0, 0] == 2
    assert {s.index for step in rec.steps for s in step} == {4}
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.serve_grpc('127.0.0.1:0')}")
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    messages = grpcclient.InferInput("messages", [1, 1], "BYTES")
    messages.set_data_from_numpy(inputs["messages"])
    params = grpcclient.InferInput("parameters", [1, 1], "BYTES")
    params.set_data_from_numpy(np.array([[b'{"max_tokens": 3}']], object))
    # a client that marks its request a whole sequence (START and END) gets every response too
    client.async_stream_infer("words", [messages, params], sequence_id=99, sequence_start=True, sequence_end=True)
    texts = []
    while len(texts) < 3:
        result, error = results.get(timeout=10)
        assert error is None, error
        texts.append(result.as_numpy("text")[0, 0])
    client.stop_stream()
    assert texts == [b"w0 ", b"w1 ", b"w2 "]
    stats = server.model("words").statistics()
    assert stats["inference_stats"]["success"]["count"] >= 2


def test_a_start_end_request_to_an_iterative_model_gets_its_final_response():
    """Triton 2.51 frees an iterative sequence's slot after its first iteration when the request
    carries END, and the rescheduled request was refused where nobody heard it: the caller waited
    forever. Each request of an iterative model is a whole sequence: END is left out."""

    def step(requests):
        out = []
        for r in requests:
            made = r.state.get("made", 0)
            r.state["made"] = made + 1
            token = {"token": np.array([[made]], np.int32)}
            out.append(Final(token) if made == 2 else token)
        return out

    server = Server()
    server.bind(
        "Iter", step, [Tensor(name="n", dtype=np.int32, shape=(1,))], [Tensor(name="token", dtype=np.int32, shape=(1,))],
        ModelConfig(decoupled=True, max_batch_size=4, sequence_batcher=SequenceBatcher(iterative=True)),
    )  # fmt: skip
    with server:
        got: list = []

        def ask() -> None:
            n = {"n": np.array([[1]], np.int32)}
            got.append([p["token"][0, 0] for p in server.model("Iter").stream(n, correlation_id=7, sequence_start=True, sequence_end=True)])  # fmt: skip

        caller = threading.Thread(target=ask, daemon=True)
        caller.start()
        caller.join(10)
        assert got == [[0, 1, 2]], "the START|END request never got its final response"


def test_bad_requests_and_step_functions_fail_alone(served):
    server, port, _, _ = served
    inputs = {"messages": np.array([[json.dumps(USER).encode()]], object), "parameters": np.array([[b'{"max_tokens": 0}']], object)}  # fmt: skip
    with pytest.raises(Exception, match="max_tokens must be a positive integer"):
        list(server.model("words").stream(inputs))
    assert client(port).chat.completions.create(model="words", messages=USER, max_tokens=1).choices[0].message.content == "w0 "  # fmt: skip
    broken = Server()
    bind_chat(broken, "short", step=lambda seqs: [])
    with broken:
        with pytest.raises(Exception, match=r"one str or Chunk per sequence \(1\), not list of 0"):
            list(
                broken.model("short").stream(
                    {"messages": inputs["messages"], "parameters": np.array([[b"{}"]], object)}
                )
            )


def test_an_iteration_may_take_longer_than_tritons_idle_limit(served):
    """An iteration counts against the sequence batcher's max_sequence_idle_microseconds; with
    Triton's default (1 s) a 1.5 s prefill ended every running sequence (503: CI saw the example
    transformer's first prefill take over 1 s under load). A batch-step model's limit is an hour."""
    _, port, _, _ = served
    answers: dict = {}

    def ask(i: int) -> None:
        out = client(port).chat.completions.create(model="long-prefill", messages=USER, max_tokens=3)
        answers[i] = out.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers == {0: "ttt", 1: "ttt"}


def test_binding_checks():
    server = Server()
    with pytest.raises(InvalidArgumentError, match="either fn .* or step="):
        bind_chat(server, "both", lambda m: "x", step=lambda s: [])
    with pytest.raises(InvalidArgumentError, match="either fn .* or step="):
        bind_completion(server, "neither")
    with pytest.raises(InvalidArgumentError, match="max_sequences must be a positive int"):
        bind_chat(server, "zero", step=lambda s: [], max_sequences=0)
    with pytest.raises(InvalidArgumentError, match="max_step_tokens must be a positive int"):
        bind_chat(server, "budget", step=lambda s: [], max_step_tokens=-1)
    with pytest.raises(InvalidArgumentError, match="on_leave must be callable"):
        bind_chat(server, "leave", step=lambda s: [], on_leave=3)


def test_the_example_transformer_batched_decodes_as_it_does_alone(tmp_path):
    """examples/llm_continuous.py: sequences of different lengths joining and leaving one batched
    decode make the same greedy text as each decoded alone (the per-request form)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "llm_continuous.py"
    spec = importlib.util.spec_from_file_location("llm_continuous", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    server = Server()
    bind_chat(server, "batched", step=example.step, max_sequences=8)
    bind_chat(server, "alone", example.generate)
    with server:
        port = server.serve_http("127.0.0.1:0", openai=True)
        api = client(port)
        answers: dict = {}

        def ask(model: str, i: int) -> None:
            talk = [{"role": "user", "content": "x" * (1 + 5 * i)}]
            out = api.chat.completions.create(model=model, messages=talk, max_tokens=3 + 2 * i, temperature=0)
            answers[model, i] = out.choices[0].message.content

        threads = [threading.Thread(target=ask, args=(m, i)) for m in ("batched", "alone") for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        steps = server.model("batched").statistics()["execution_count"]
    assert all(len(answers["batched", i]) == 3 + 2 * i for i in range(6)), answers
    assert [answers["batched", i] for i in range(6)] == [answers["alone", i] for i in range(6)]
    assert steps < sum(3 + 2 * i for i in range(6))  # (iterations were shared)
