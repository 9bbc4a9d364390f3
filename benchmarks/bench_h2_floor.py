"""The native gRPC transport's floor: perf_analyzer against embedtriton._h2 with a trivial Python handler.

No Triton and no inference: the handler answers the KServe RPCs that perf_analyzer makes (ServerLive,
ModelMetadata, ModelConfig, ModelStatistics, ModelInfer) with messages built from tritonclient's
generated modules. ``--mode canned`` answers ModelInfer with prebuilt bytes (the transport floor);
``--mode parse`` also parses the request and computes add/sub with numpy.

    python benchmarks/bench_h2_floor.py --concurrency 1 32 --runs 3

Prints concurrency, infer/s and p50 latency (medians of the runs) and the server's RSS after each
concurrency level, which shows whether memory grows with the number of calls.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from embedtriton import _h2  # noqa: E402

PREFIX = "/inference.GRPCInferenceService/"
SHAPE = [1, 16]


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class FloorHandler:
    def __init__(self, mode: str):
        self.mode = mode
        self.count = 0
        zeros = np.zeros(SHAPE, np.float32).tobytes()
        self.canned = self._infer_response(zeros, zeros, "")

    @staticmethod
    def _infer_response(add: bytes, sub: bytes, request_id: str) -> bytes:
        r = pb.ModelInferResponse(model_name="AddSub", model_version="1", id=request_id)
        for name in ("add", "sub"):
            r.outputs.add(name=name, datatype="FP32", shape=SHAPE)
        r.raw_output_contents.extend([add, sub])
        return r.SerializeToString()

    def on_message(self, call, data):
        call.user = data

    def on_cancel(self, call):
        pass

    def on_half_close(self, call):
        method = call.method
        data = call.user or b""
        if method == PREFIX + "ModelInfer":
            self.count += 1
            if self.mode == "canned":
                call.send(self.canned)
            else:
                req = pb.ModelInferRequest.FromString(data)
                a = np.frombuffer(req.raw_input_contents[0], np.float32)
                b = np.frombuffer(req.raw_input_contents[1], np.float32)
                call.send(self._infer_response((a + b).tobytes(), (a - b).tobytes(), req.id))
            call.finish(0)
            return
        reply = self.control(method)
        if reply is None:
            call.finish(12, f"unknown method {method}")
        else:
            call.send(reply.SerializeToString())
            call.finish(0)

    def control(self, method):
        name = method[len(PREFIX) :] if method.startswith(PREFIX) else ""
        if name == "ServerLive":
            return pb.ServerLiveResponse(live=True)
        if name == "ServerReady":
            return pb.ServerReadyResponse(ready=True)
        if name == "ModelReady":
            return pb.ModelReadyResponse(ready=True)
        if name == "ServerMetadata":
            return pb.ServerMetadataResponse(name="embedtriton", version="0")
        if name == "ModelMetadata":
            t = [pb.ModelMetadataResponse.TensorMetadata(name=n, datatype="FP32", shape=[-1, -1]) for n in "ab"]
            o = [
                pb.ModelMetadataResponse.TensorMetadata(name=n, datatype="FP32", shape=[-1, -1]) for n in ("add", "sub")
            ]
            return pb.ModelMetadataResponse(name="AddSub", versions=["1"], platform="embedtriton", inputs=t, outputs=o)
        if name == "ModelConfig":
            cfg = mc.ModelConfig(name="AddSub", platform="embedtriton", max_batch_size=128)
            for n in "ab":
                cfg.input.add(name=n, data_type=mc.TYPE_FP32, dims=[-1])
            for n in ("add", "sub"):
                cfg.output.add(name=n, data_type=mc.TYPE_FP32, dims=[-1])
            return pb.ModelConfigResponse(config=cfg)
        if name == "ModelStatistics":
            s = pb.ModelStatisticsResponse()
            m = s.model_stats.add(name="AddSub", version="1", inference_count=self.count, execution_count=self.count)
            m.inference_stats.success.count = self.count
            return s
        return None


def perf_analyzer(port: int, concurrency: int, interval_ms: int, stability: int) -> tuple[float, float]:
    exe = os.environ.get("PERF_ANALYZER", str(Path(sys.executable).parent / "perf_analyzer"))
    env = dict(os.environ)
    env.setdefault("LD_LIBRARY_PATH", "/tmp/palib")
    cmd = [exe, "-m", "AddSub", "-i", "grpc", "-u", f"127.0.0.1:{port}", "--concurrency-range", str(concurrency)]
    cmd += ["--shape", "a:16", "--shape", "b:16", "--measurement-interval", str(interval_ms), "--percentile", "50"]
    # On a 2-vCPU box the 3-s windows swing by more than perf_analyzer's default 10 %, and it would measure forever.
    cmd += ["--stability-percentage", str(stability), "--max-trials", "10"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    tput = re.search(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec", text)
    p50 = re.search(r"p50 latency: (\d+) usec", text)
    if out.returncode != 0 or not tput or not p50:
        raise RuntimeError(f"perf_analyzer failed ({out.returncode}):\n{text}")
    return float(tput.group(1)), float(p50.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=18101)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--interval", type=int, default=3000, help="perf_analyzer measurement interval, ms")
    ap.add_argument("--stability", type=int, default=30, help="perf_analyzer --stability-percentage")
    ap.add_argument("--mode", choices=["canned", "parse"], default="canned")
    args = ap.parse_args()

    handler = FloorHandler(args.mode)
    srv = _h2.Server("127.0.0.1", args.port, handler, 64 << 20, None, None)
    print(f"mode={args.mode}  RSS at start {rss_mib():.1f} MiB")
    print(f"{'concurrency':>11} {'infer/s':>10} {'p50 us':>8} {'RSS MiB':>8} {'calls':>9}  runs (infer/s)")
    try:
        for c in args.concurrency:
            runs = [perf_analyzer(args.port, c, args.interval, args.stability) for _ in range(args.runs)]
            tput = statistics.median(r[0] for r in runs)
            p50 = statistics.median(r[1] for r in runs)
            each = " ".join(f"{r[0]:.0f}" for r in runs)
            print(f"{c:>11} {tput:>10.0f} {p50:>8.0f} {rss_mib():>8.1f} {handler.count:>9}  {each}", flush=True)
    finally:
        srv.stop(1.0)


if __name__ == "__main__":
    main()
