"""The examples run as documented and print what they promise."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, tmp_path: Path) -> str:
    # cwd elsewhere: the installed package is imported, not the source tree
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_add_sub_example(tmp_path):
    out = run_example("add_sub.py", tmp_path)
    assert "add = [11. 22.], sub = [ -9. -18.]" in out
    assert "all answers correct" in out and "model executions" in out
    assert "requests: 65 (66 rows), model executions: " in out  # 1 call of 2 rows + 64 of 1 (it said 66)


def test_response_cache_example(tmp_path):
    out = run_example("response_cache.py", tmp_path)
    assert "3 identical requests, 1 call(s) of the function; cache hits: 2" in out


def test_model_warmup_example(tmp_path):
    out = run_example("model_warmup.py", tmp_path)
    assert "warm-up batches seen before the first request: [((1, 1), (1, 1))]" in out


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_has_a_docstring(name):
    assert (EXAMPLES / name).read_text().startswith('"""')


def test_streaming_example(tmp_path):
    out = run_example("streaming.py", tmp_path)
    assert "stream(): the quick brown fox jumps" in out
    assert "stream_async(): 2 tokens: the quick" in out
    assert out.count("stream_async():") == 3


def test_scheduling_example(tmp_path):
    out = run_example("scheduling.py", tmp_path)
    assert "executed: busy, URGENT, low-0, low-1, low-2" in out
    assert "one too many: UnavailableError" in out and "queue size" in out
    assert "hasty: UnavailableError: Request timeout expired" in out
    assert "2 * factor 10 = 20.0" in out
    seconds = float(out.split("both done in ")[1].split(" s")[0])
    assert seconds < 0.55  # two 0.3 s requests side by side, not one after the other


def test_accumulator_example(tmp_path):
    out = run_example("accumulator.py", tmp_path)
    assert "sequence 2: running totals [2, 4, 6, 8, 10]" in out
    assert "every running total correct" in out


def test_batch_rules_example(tmp_path):
    out = run_example("batch_rules.py", tmp_path)
    assert "(max 16)" in out or "(max 1" in out  # the budget held
    budgets = out.split("tokens per batch: [")[1].split("]")[0]
    assert max(int(b) for b in budgets.split(", ")) <= 16
    assert "each of one adapter: True" in out


def test_continuous_batching_example(tmp_path):
    out = run_example("continuous_batching.py", tmp_path)
    assert "12 tokens (first after" in out and "lorem ipsum dolor sit amet" in out
    iterations, tokens = out.strip().splitlines()[-1].split(" iterations for ")
    assert int(iterations) < int(tokens.split()[0])  # requests shared iterations


def test_grpc_serving_example(tmp_path):
    pytest.importorskip("tritonclient.grpc")
    pytest.importorskip("opentelemetry.sdk.trace")
    out = run_example("grpc_serving.py", tmp_path)
    assert "add = [11. 22. 33.], sub = [ -9. -18. -27.]" in out
    assert "shared memory: add = [11. 22. 33.]" in out
    assert "health of 'AddSub': SERVING" in out
    assert "span AddSub" in out and "span queue" in out and "parent 00f067aa0ba902b7" in out


def test_graceful_stop_example(tmp_path):
    out = run_example("graceful_stop.py", tmp_path)
    assert "during the drain: health NOT_SERVING" in out
    assert "a new request gets StatusCode.UNAVAILABLE: the server is stopping" in out
    assert "the request in flight: y = 42.0 (error: None)" in out
    assert float(out.split("stop() returned after ")[1].split(" s")[0]) < 5


def test_triton_example_models_serve():
    """`embedtriton serve triton_example_models:bind` serves the models Triton's example clients expect."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    serve = subprocess.Popen(
        [sys.executable, "-m", "embedtriton", "serve", "triton_example_models:bind", "--grpc", "127.0.0.1:0"]
        + ["--metrics", "", "--grpc-infer-response-compression-level", "low"],  # tritonclient decodes gzip
        cwd=EXAMPLES,  # where the module is; not the repository root, whose source tree would shadow the package
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        log = []
        while not log or " ready: " not in log[-1]:
            line = serve.stderr.readline()
            assert line, "".join(log)  # it exited
            log.append(line)
        port = int("".join(log).split("serving gRPC on 127.0.0.1:0 (port ")[1].split(")")[0])
        assert "simple, simple_int8, simple_string, simple_identity, simple_sequence" in log[-1]
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        result = grpcclient.InferenceServerClient(f"127.0.0.1:{port}").infer("simple", inputs)
        assert result.as_numpy("OUTPUT0").tolist() == [list(range(0, 32, 2))]
    finally:
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=60) == 0
        serve.stderr.close()


def test_pipeline_example(tmp_path):
    out = run_example("pipeline.py", tmp_path)
    ensemble = out.split("PipelineEnsemble: ")[1].splitlines()[0]
    bls = out.split("PipelineBLS: ")[1].splitlines()[0]
    assert ensemble == bls and ensemble.startswith("triton->")  # the same answers both ways
    counts = {
        line.split(":")[0].strip(): int(line.split(":")[1].split()[0])
        for line in out.splitlines()
        if " requests in " in line
    }
    assert counts["Preprocess"] == counts["Model"] == counts["Postprocess"] == 2 * counts["PipelineEnsemble"]


def test_hot_swap_example(tmp_path):
    out = run_example("hot_swap.py", tmp_path)
    total = out.split("total: ")[1].splitlines()[0]
    assert total.endswith("errors: 0")
    v1, v2 = (int(part.split(": ")[1]) for part in total.split(", ")[:2])
    assert v1 > 0 and v2 > 0
    assert "version 1 ready: False, version 2 ready: True" in out


def test_serve_repository_example(tmp_path):
    out = run_example("serve_repository.py", tmp_path)
    assert "models: Adder, Doubler, Scale, Twice" in out
    assert "Adder(1) = 3.0  Twice(1) = 5.0  Doubler(1) = 2.0  Scale(1) = 10.0" in out
    assert "a version 3 folder appeared: Adder(1) = 31.0" in out and "edited:     Adder(1) = 301.0" in out
    assert "failed requests while the repository changed: 0" in out


def test_restricted_apis_example(tmp_path):
    pytest.importorskip("tritonclient.grpc")
    pytest.importorskip("tritonclient.http")
    out = run_example("restricted_apis.py", tmp_path)
    assert "gRPC live (health is open): True" in out
    assert (
        "gRPC infer without the key: StatusCode.UNAVAILABLE This protocol is restricted, expecting header "
        "'triton-grpc-protocol-infer-key'" in out
    )
    assert "gRPC infer with it: hello, acme" in out
    assert "HTTP unload without the admin key: 403 This API is restricted, expecting header 'admin-key'" in out
    assert "HTTP log settings with it: 0" in out and "HTTP infer with the key: hello, globex" in out


def test_http_serving_example(tmp_path):
    pytest.importorskip("tritonclient.http")
    out = run_example("http_serving.py", tmp_path)
    assert "tritonclient.http: add = [11. 22.], sub = [ -9. -18.]" in out
    assert "JSON: [('add', [4.0, 6.0]), ('sub', [-2.0, -2.0])]" in out
    assert "generate_stream: 200 text/event-stream; charset=utf-8" in out
    assert "4 events: the quick brown fox" in out
    assert 'nv_inference_request_success{model="AddSub",version="1"} 2' in out


def test_openai_chat_example(tmp_path):
    pytest.importorskip("openai")
    out = run_example("openai_chat.py", tmp_path)
    assert "models: ['parrot', 'vowels']" in out
    assert "chat: You said: hello from the openai client (7 tokens)" in out
    assert "stream: You |said: |one |two " in out
    assert "embeddings: [[3.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0, 0.0]]" in out


def test_llm_continuous_example(tmp_path):
    pytest.importorskip("openai")
    out = run_example("llm_continuous.py", tmp_path)
    assert "greedy: '" in out and "(length)" in out and "same again: True" in out
    assert len(out.split("stream: ")[1].splitlines()[0].split("|")) == 10  # the role chunk, 8 tokens, the end
    assert "8 concurrent clients: 176 tokens in " in out  # 8 + 4 * i tokens each, all of them


def test_tuning_example(tmp_path):
    out = run_example("tuning.py", tmp_path)
    best = out.split("best: ")[1].splitlines()[0]
    assert "p99 within 10.0 ms" in best
    assert "config = ModelConfig(" in out
    report = json.loads((tmp_path / "tuning-report" / "report.json").read_text())
    fitting = [t for t in report["trials"] if t["p99_ms"] <= 10.0]
    assert report["best"]["throughput"] == max(t["throughput"] for t in fitting), out  # the fastest within budget
    # Batch 1 at 32 in flight serves one row per 2 ms; batching serves many. (A p99 budget is a
    # timing: on a loaded machine every trial at 32 in flight may miss it, and then the claim is
    # the benchmarks' to make, not this test's.)
    if any(t["concurrency"] == 32 for t in fitting):
        gain = float(best.split("(")[1].split("x the config as bound")[0])
        assert gain >= 4, out


def test_ray_serve_example(tmp_path):
    pytest.importorskip("ray.serve", reason='Ray Serve is not installed (pip install "embedtriton[ray]")')
    out = run_example("ray_serve.py", tmp_path)
    assert "1000 requests, 1000 answered right" in out
    took = [int(line.split("): ")[1].split(" requests")[0]) for line in out.splitlines() if line.startswith("replica ")]
    assert len(took) == 2 and sum(took) == 1000 and min(took) > 100, out  # spread over both replicas
    executions = [
        int(line.split(" in ")[1].split(" executions")[0]) for line in out.splitlines() if "executions" in line
    ]
    assert sum(executions) < 1000, out  # Triton batched inside the replicas
    assert "over Ray Serve HTTP (KServe-v2 REST): [2.0, 4.0, 6.0, 8.0]" in out and "shut down" in out


def test_offline_scoring_example(tmp_path):
    out = run_example("offline_scoring.py", tmp_path)
    assert "all scores correct" in out
    assert "6 results, failed: [3] (InvalidArgumentError)" in out
    assert "infer_many(max_in_flight=64)" in out and "rows/s" in out


def test_gpu_example_says_what_it_needs_without_a_gpu(tmp_path):
    from embedtriton.triton.devices import cuda_devices

    if cuda_devices()[0]:
        pytest.skip("this machine has a GPU: tests/gpu/test_gpu.py runs the example")
    out = run_example("gpu_zero_copy.py", tmp_path)
    assert out.startswith("this example needs a CUDA GPU and cupy: ")


def test_torch_model_example(tmp_path):
    pytest.importorskip("torch", reason="the example needs torch (nox's tests session installs its CPU build)")
    out = run_example("torch_model.py", tmp_path)
    assert "device: cpu" in out or "device: cuda" in out, out
    labels = out.split("labels: ")[1].splitlines()[0]
    assert len(json.loads(labels)) == 16 and len(set(json.loads(labels))) > 1, out  # the classes differ by image
    executions = int(out.split("16 requests in ")[1].split(" executions")[0])
    assert executions < 16, out  # Triton batched the 16 threads' requests
    assert "the module's own logits" in out
