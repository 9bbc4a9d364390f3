"""A real PyTorch model (examples/torch_model.py's convolutional classifier) three ways, in one
run: the module called directly (the floor), bound with embedtriton (``gpu_arrays="torch"``,
Triton's dynamic batcher), and served by Triton's own python backend from a repository (the same
module, built by the same function, in the same Triton runtime and server).

Two measurements, in interleaved rounds (medians of the rounds):

- batch 1, one caller: latency p50 and the overhead per call over the direct call, in process
  (``server.model(name).infer``) and over gRPC (tritonclient, a client process of its own;
  on a GPU its tensors travel in CUDA shared memory);
- ``--clients`` callers at once (32): images per second, against the module run directly one
  image at a time and on whole batches of ``--clients`` images (the ceiling batching can reach).

The python backend runs on a stub environment with torch: ``--stub-venv`` (default: the
tests' EMBEDTRITON_TEST_STUB_VENV, else a fresh one in a temporary folder, with numpy<2 and
torch's CPU build); ``--no-python-backend`` leaves it out. On a machine with a CUDA GPU the model
and its inputs are on the GPU (``--device`` to choose).

    python benchmarks/bench_torch.py [--quick] [--rounds 3] [--seconds 2] [--clients 32]

Writes benchmarks/results/torch_model.json (or --json). Needs torch; says so and exits 0 without.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
RESULTS = HERE / "results"
sys.path.insert(0, str(EXAMPLES))

PYTHON_BACKEND_MODEL = '''
import json
import sys

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """examples/torch_model.py's classifier, as a python-backend model would serve it."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        sys.path.insert(0, parameters["examples"]["string_value"])
        from torch_model import build_model

        self.device = "cuda" if args["model_instance_kind"] == "GPU" else "cpu"
        self.model = build_model().to(self.device)

    def execute(self, requests):
        images = [pb_utils.get_input_tensor_by_name(r, "image").as_numpy() for r in requests]
        with torch.inference_mode():
            logits = self.model(torch.as_tensor(np.concatenate(images), device=self.device)).cpu().numpy()
        labels = logits.argmax(1).astype(np.int64)[:, None]
        responses, start = [], 0
        for image in images:
            end = start + len(image)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("logits", logits[start:end]), pb_utils.Tensor("label", labels[start:end])
            ]))
            start = end
        return responses
'''
PYTHON_BACKEND_CONFIG = """
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "image" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] }} ]
output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ 10 ] }}, {{ name: "label" data_type: TYPE_INT64 dims: [ 1 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: {kind} }} ]
parameters {{ key: "examples" value: {{ string_value: "{examples}" }} }}
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- callers in threads -----------------------------------------------------------------------


Opened = tuple[Callable[[], Any], Callable[[], None]]  # a thread's call and what closes it


def in_threads(open_call: Callable[[int], Opened], clients: int, seconds: float) -> dict:
    """``clients`` threads; thread k calls the ``call`` of ``open_call(k) -> (call, close)`` once
    outside the clock, then, from when all are ready, for ``seconds``, then closes it. Every
    call's latency (us), the calls counted, the seconds taken and the errors met."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    errors: list[str] = []

    def worker(k: int) -> None:
        mine, clock = latencies[k], time.perf_counter
        try:
            call, close = open_call(k)
        except Exception as exc:  # reported, not hidden; the others are let go
            errors.append(f"{type(exc).__name__}: {exc}")
            barrier.abort()
            return
        try:
            call()
            barrier.wait()
            end = clock() + seconds
            while (start := clock()) < end:
                call()
                mine.append((clock() - start) * 1e6)
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    began = time.perf_counter()
    for t in threads:
        t.join()
    flat = [x for per in latencies for x in per]
    return {"latencies": flat, "calls": len(flat), "seconds": time.perf_counter() - began, "errors": errors}


def shared(call: Callable[[], Any]) -> Callable[[int], Opened]:
    """``in_threads``' ``open_call`` for a call every thread makes as it is."""
    return lambda k: (call, lambda: None)


def grpc_client(port: int, model: str, clients: int, seconds: float, cuda_shm: bool) -> dict:
    """The gRPC ways' client, in a process of its own: ``clients`` threads, each with its own
    connection, calling ``model`` with one image for ``seconds`` (``in_threads``' answer)."""
    import tritonclient.grpc as grpcclient
    from torch_model import IMAGE

    image = np.random.default_rng(1).standard_normal((1, *IMAGE), dtype=np.float32)

    def open_call(k: int) -> Opened:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        inputs = [grpcclient.InferInput("image", list(image.shape), "FP32")]
        outputs = [grpcclient.InferRequestedOutput("logits"), grpcclient.InferRequestedOutput("label")]
        regions: list[tuple[str, Any]] = []
        if cuda_shm:  # the image and both outputs in the GPU memory of this client (as Triton's cudashm clients do)
            import tritonclient.utils.cuda_shared_memory as cudashm

            for tensor, size in ((inputs[0], image.nbytes), (outputs[0], 10 * 4), (outputs[1], 8)):
                region = f"c{k}_{tensor.name()}"
                handle = cudashm.create_shared_memory_region(region, size, 0)
                client.register_cuda_shared_memory(region, cudashm.get_raw_handle(handle), 0, size)
                tensor.set_shared_memory(region, size)
                regions.append((region, handle))
            cudashm.set_shared_memory_region(regions[0][1], [image])
        else:
            inputs[0].set_data_from_numpy(image)

        def close() -> None:
            for region, handle in regions:
                client.unregister_cuda_shared_memory(region)
                cudashm.destroy_shared_memory_region(handle)
            client.close()

        return lambda: client.infer(model, inputs, outputs=outputs), close

    return in_threads(open_call, clients, seconds)


def stub_environment(path: str | None) -> Path:
    """A virtual environment for the python backend's stub, with numpy<2 and torch (CPU build)."""
    root = Path(path or os.environ.get("EMBEDTRITON_TEST_STUB_VENV") or Path(tempfile.mkdtemp()) / "stub")
    python = root / "bin" / "python"
    if not python.exists():
        log(f"making the python backend's stub environment in {root} (numpy<2, torch's CPU build)")
        venv.EnvBuilder(with_pip=True).create(root)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for module, requirement in (("numpy", "numpy<2"), ("torch", "torch==2.13.0+cpu")):
        if subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode:
            subprocess.run([*pip, requirement], check=True, timeout=900)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 round of 0.5 s per way (a smoke check)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per way and round (default 2)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent callers (default 32)")
    parser.add_argument("--device", default="auto", help="auto (cuda where torch sees a GPU), cpu or cuda")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch's CPU threads in every process, the python backend's stub too (default 1: on a small "
        "machine its OpenMP workers would spin against the other processes; 0: torch's default)",
    )
    parser.add_argument("--no-python-backend", action="store_true", help="leave Triton's python backend out")
    parser.add_argument("--stub-venv", default=None, help="the python backend stub's virtual environment")
    parser.add_argument("--json", default=str(RESULTS / "torch_model.json"), help="where the results go")
    parser.add_argument(
        "--grpc-client", nargs=4, metavar=("PORT", "MODEL", "CLIENTS", "SECONDS"), help=argparse.SUPPRESS
    )
    parser.add_argument("--cuda-shm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.grpc_client:
        port, model, clients, seconds = args.grpc_client
        print(json.dumps(grpc_client(int(port), model, int(clients), float(seconds), args.cuda_shm)))
        return 0
    if args.torch_threads:  # before torch is imported; the stub inherits the environment
        os.environ["OMP_NUM_THREADS"] = str(args.torch_threads)
    try:
        import torch
    except ImportError as exc:
        print(f"bench_torch needs torch: {exc}")
        return 0
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    clients = args.clients

    from torch_model import IMAGE, bind, build_model

    from embedtriton import Server, ServerConfig

    with_backend = not args.no_python_backend
    config = ServerConfig()
    path = os.environ["PATH"]
    if with_backend:
        stub = stub_environment(args.stub_venv)
        os.environ["PATH"] = f"{stub / 'bin'}{os.pathsep}{path}"  # the stub runs on the first python3 on PATH
        repository = Path(tempfile.mkdtemp()) / "models"
        folder = repository / "classifier_python"
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.py").write_text(textwrap.dedent(PYTHON_BACKEND_MODEL))
        kind = "KIND_GPU" if device != "cpu" else "KIND_CPU"
        (folder / "config.pbtxt").write_text(
            PYTHON_BACKEND_CONFIG.format(max_batch_size=clients, kind=kind, examples=EXAMPLES)
        )
        config = ServerConfig(model_repository=[str(repository)], model_control_mode="none")

    server = Server(config)
    bind(server, "classifier", max_batch_size=clients, device=device)
    module = build_model().to(device)
    rng = np.random.default_rng(0)
    image = rng.standard_normal((1, *IMAGE), dtype=np.float32)
    images = rng.standard_normal((clients, *IMAGE), dtype=np.float32)
    on_gpu = device != "cpu"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    x1 = torch.as_tensor(image, device=device)
    xn = torch.as_tensor(images, device=device)

    def direct() -> None:
        with torch.inference_mode():
            module(x1)
        sync()

    def direct_batch() -> None:
        with torch.inference_mode():
            module(xn)
        sync()

    results: dict[str, list[dict]] = {}
    with server:
        port = server.serve_grpc("127.0.0.1:0")
        served = ["classifier"] + (["classifier_python"] if with_backend else [])
        models = {name: server.model(name) for name in served}
        feed = {"image": x1 if on_gpu else image}

        def in_process(name: str):
            model = models[name]
            if on_gpu and name == "classifier":  # a CUDA tensor in, the outputs left on the GPU
                return lambda: (model.infer(feed, output_device="gpu"), sync())
            return lambda: model.infer({"image": image})  # (the python backend's stub takes host tensors)

        def over_grpc(name: str, n: int) -> dict:
            command = [sys.executable, __file__, "--grpc-client", str(port), name, str(n), str(seconds)]
            if on_gpu:
                command.append("--cuda-shm")
            done = subprocess.run(command, capture_output=True, text=True, timeout=seconds * 4 + 120)
            if done.returncode != 0:
                raise RuntimeError(f"the gRPC client failed: {done.stderr[-2000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        ways: list[tuple[str, object]] = [
            ("direct, batch 1", lambda: in_threads(shared(direct), 1, seconds)),
            (f"direct, batch {clients}", lambda: in_threads(shared(direct_batch), 1, seconds)),
        ]
        for name in served:
            label = "embedtriton" if name == "classifier" else "python backend"
            ways += [
                (f"{label}, in process, 1 caller", lambda name=name: in_threads(shared(in_process(name)), 1, seconds)),
                (f"{label}, in process, {clients} callers", lambda name=name: in_threads(shared(in_process(name)), clients, seconds)),
                (f"{label}, gRPC, 1 client", lambda name=name: over_grpc(name, 1)),
                (f"{label}, gRPC, {clients} clients", lambda name=name: over_grpc(name, clients)),
            ]  # fmt: skip
        for call in (direct, direct_batch, in_process("classifier")):  # warm up
            for _ in range(20):
                call()
        for r in range(rounds):
            for way, measure in ways:
                result = measure()
                if result["errors"]:
                    raise RuntimeError(f"{way}: {result['errors'][:3]}")
                results.setdefault(way, []).append(result)
                log(
                    f"round {r + 1}/{rounds} {way}: {result['calls']} calls, p50 {percentile(result['latencies'], 0.5):,.0f} us"
                )
    os.environ["PATH"] = path

    def per_round(way: str, what: str) -> float:
        values = []
        for result in results[way]:
            if what == "p50":
                values.append(percentile(result["latencies"], 0.5))
            else:
                per_call = clients if way.startswith(f"direct, batch {clients}") else 1
                values.append(result["calls"] * per_call / result["seconds"])
        return statistics.median(values)

    floor_us = per_round("direct, batch 1", "p50")
    floor_rate = per_round("direct, batch 1", "rate")
    ceiling = per_round(f"direct, batch {clients}", "rate")
    lines = [
        f"torch {torch.__version__} on {device} ({torch.get_num_threads()} CPU thread(s)); "
        f"{rounds} round(s) of {seconds:g} s per way; "
        f"{platform.machine()}, {os.cpu_count()} CPUs",
        "",
        f"| way | p50 latency | overhead per call | images/s | ÷ direct batch 1 | ÷ direct batch {clients} |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    table = {}
    for way in results:
        p50, rate = per_round(way, "p50"), per_round(way, "rate")
        single = way == "direct, batch 1" or way.endswith((", 1 caller", ", 1 client"))
        overhead = p50 - floor_us if single else None
        table[way] = {"p50_us": p50, "overhead_us": overhead, "images_per_s": rate}
        lines.append(
            f"| {way} | {p50:,.0f} us | {'' if overhead is None else f'{overhead:+,.0f} us'} | {rate:,.0f} "
            f"| {rate / floor_rate:.2f}x | {rate / ceiling:.2f}x |"
        )
    print("\n".join(lines))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "device": device,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "rounds": rounds,
                "seconds": seconds,
                "clients": clients,
                "table": table,
            },
            indent=2,
        )
    )
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
