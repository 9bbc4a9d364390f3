"""A stand-in for Hugging Face ``transformers`` in PyTriton's ``perf_analyzer`` example, whose
server loads ``facebook/bart-large-mnli`` on a GPU: neither the weights (no network) nor a GPU
are here. The example's server runs unmodified on top of it; only the model's scores are made
up (deterministic: by how many of a label's letters the sequence contains), and each takes
``SECONDS_PER_CALL`` as a model's forward pass does: perf_analyzer's count windows (100 requests,
in the example's client.sh) are then long enough to measure stably on a busy machine; a
microsecond-fast stand-in gave 50 ms windows that perf_analyzer often found unstable. Put on
PYTHONPATH by ``tests/pytriton/test_upstream_examples.py`` for that server alone."""

from __future__ import annotations

import time
from typing import Any

SECONDS_PER_CALL = 0.002


def pipeline(task: str, model: str | None = None, **_: Any):  # noqa: ANN201 (transformers' signature)
    """``pipeline("zero-shot-classification", ...)``: a callable(sequence, labels) -> dict with
    ``labels`` and ``scores`` (summing to 1, best first), as the real pipeline answers."""
    if task != "zero-shot-classification":
        raise ValueError(f"this stand-in only knows zero-shot-classification, not {task!r}")

    def classify(sequence: str, candidate_labels: list[str]) -> dict[str, Any]:
        time.sleep(SECONDS_PER_CALL)
        raw = [1 + sum(ch in sequence for ch in label) for label in candidate_labels]
        total = sum(raw)
        ranked = sorted(zip(candidate_labels, (r / total for r in raw), strict=True), key=lambda p: -p[1])
        return {"sequence": sequence, "labels": [p[0] for p in ranked], "scores": [p[1] for p in ranked]}

    return classify
