"""NVIDIA's aiperf, as users benchmark OpenAI-compatible servers, against
``examples/llm_continuous.py`` served by ``embedtriton serve --openai``: the batch-step model
(``tiny``) and the same transformer in the per-request form (``tiny-alone``), streaming chat at
1, 8 and 32 concurrent requests.

aiperf counts tokens with a tokenizer; the model's own is byte-level, so a matching Hugging Face
tokenizer folder (a byte per token, no merges) is built here with ``tokenizers`` (one of aiperf's
dependencies): nothing is downloaded. Prints aiperf's output token throughput and time to first
token (p50, p99) per cell, and the batch-step / per-request ratio. ``nox -s aiperf`` installs
aiperf and runs this; its artifacts stay in ``--output``.

    python benchmarks/aiperf_llm.py [--requests-per-client 4] [--output aiperf-results]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CONCURRENCY = (1, 8, 32)


def byte_tokenizer(folder: Path) -> None:
    """A Hugging Face tokenizer with a token per byte (the example model's tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(str(folder))


def start_server() -> tuple[subprocess.Popen, int]:
    command = [sys.executable, "-m", "embedtriton", "serve", "llm_continuous:bind", "--openai"]
    server = subprocess.Popen(
        [*command, "--http", "127.0.0.1:0", "--grpc", "", "--metrics", ""],
        cwd=EXAMPLES,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    seen = []
    while time.monotonic() < deadline:
        line = server.stderr.readline()
        seen.append(line)
        if not line or "ready:" in line:
            break
    found = re.search(r"serving HTTP on .* \(port (\d+)\)", "".join(seen))
    if not found:
        server.kill()
        raise SystemExit("the server did not start:\n" + "".join(seen))
    return server, int(found.group(1))


def profile(port: int, model: str, concurrency: int, requests: int, tokenizer: Path, out: Path) -> dict:
    """One aiperf run; its summary metrics (profile_export_aiperf.json)."""
    artifacts = out / f"{model}-c{concurrency}"
    shutil.rmtree(artifacts, ignore_errors=True)
    aiperf = shutil.which("aiperf") or str(Path(sys.executable).with_name("aiperf"))
    done = subprocess.run(
        [
            aiperf, "profile", "--model", model, "--url", f"http://127.0.0.1:{port}", "--endpoint-type", "chat",
            "--streaming", "--tokenizer", str(tokenizer), "--concurrency", str(concurrency),
            "--request-count", str(requests), "--warmup-request-count", str(concurrency),
            "--prompt-input-tokens-mean", "32", "--prompt-output-tokens-mean", "24", "--prompt-output-tokens-stddev", "12",
            "--random-seed", "0", "--output-artifact-dir", str(artifacts), "--ui-type", "none",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"aiperf failed for {model} at {concurrency}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    errors = summary.get("error_summary") or []
    if errors:
        raise SystemExit(f"aiperf saw errors for {model} at {concurrency}: {errors}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--output", type=Path, default=Path("aiperf-results"))
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    tokenizer = args.output / "byte-tokenizer"
    byte_tokenizer(tokenizer)
    server, port = start_server()
    rows = []
    try:
        for concurrency in CONCURRENCY:
            requests = max(8, concurrency * args.requests_per_client)
            cell = {}
            for model in ("tiny-alone", "tiny"):
                cell[model] = profile(port, model, concurrency, requests, tokenizer, args.output)
                print(f"  {model} at concurrency {concurrency} done", file=sys.stderr, flush=True)
            rows.append((concurrency, cell))
    finally:
        server.terminate()
        server.wait(60)

    def metric(summary: dict, name: str, stat: str) -> float:
        return float(summary[name][stat])

    print("\naiperf against examples/llm_continuous.py (streaming chat, ~32 input and ~24 output tokens)")
    print(f"{'concurrency':>11} | {'tok/s per-request':>17} {'batch-step':>10} {'ratio':>6} | "
          f"{'TTFT p50 per-req':>16} {'step':>9} | {'TTFT p99 per-req':>16} {'step':>9}")  # fmt: skip
    for concurrency, cell in rows:
        alone, step = cell["tiny-alone"], cell["tiny"]
        a, s = (metric(x, "output_token_throughput", "avg") for x in (alone, step))
        p50a, p50s = (metric(x, "time_to_first_token", "p50") for x in (alone, step))
        p99a, p99s = (metric(x, "time_to_first_token", "p99") for x in (alone, step))
        print(f"{concurrency:>11} | {a:>17,.0f} {s:>10,.0f} {s / a:>5.2f}x | "
              f"{p50a:>13.1f} ms {p50s:>6.1f} ms | {p99a:>13.1f} ms {p99s:>6.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
