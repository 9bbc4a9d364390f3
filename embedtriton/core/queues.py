"""What Triton's metrics and statistics do not see of a bound model's queue policies.

A bound model with queue policies or priority levels keeps its queue in front of Triton's (see
``embedtriton/native/_native/queues.c``): Triton only sees a request once an instance is free
for it. So its numbers are completed here from the queue's own: the requests waiting in it
count as pending, the time those let through waited in it counts as queue time (and in their
request duration), and those it failed (a timeout under REJECT, a cancel) count as failures,
as Triton's own queue would have counted them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backend import library


@dataclass(frozen=True)
class QueueStats:
    waiting: int
    waited_ns: int
    rejected: int
    rejected_ns: int
    cancelled: int
    cancelled_ns: int


def queue_stats(handle: int) -> dict[tuple[str, str], QueueStats]:
    """(model, version) -> the numbers of its queue, for the models of the server that have one."""
    return {
        (name, str(version)): QueueStats(*numbers) for name, version, *numbers in library.native().gate_stats(handle)
    }


def with_queues_in_metrics(text: str, stats: dict[tuple[str, str], QueueStats]) -> str:
    """Triton's metrics (Prometheus text) with each model's queue added."""
    if not stats:
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("nv_inference_") or "{" not in line:
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        fields = dict(part.split("=", 1) for part in labels.rstrip("}").split(",") if "=" in part)
        q = stats.get((fields.get("model", "").strip('"'), fields.get("version", "").strip('"')))
        if q is None:
            continue
        add = {
            "nv_inference_pending_request_count": q.waiting,
            "nv_inference_queue_duration_us": q.waited_ns // 1000,
            "nv_inference_request_duration_us": q.waited_ns // 1000,
        }.get(name, 0)
        if name == "nv_inference_request_failure":
            add = {'"REJECTED"': q.rejected, '"CANCELED"': q.cancelled}.get(fields.get("reason", ""), 0)
        if add:
            lines[i] = f"{head} {int(float(value)) + add}"
    return "\n".join(lines)


def with_queue_in_statistics(entry: dict[str, Any], stats: dict[tuple[str, str], QueueStats]) -> dict[str, Any]:
    """A model's entry of Triton's statistics with its queue added."""
    q = stats.get((str(entry.get("name")), str(entry.get("version"))))
    inference = entry.get("inference_stats")
    if q is None or not isinstance(inference, dict):
        return entry
    for key, ns in (("queue", q.waited_ns), ("success", q.waited_ns)):
        if key in inference:
            inference[key]["ns"] = int(inference[key].get("ns", 0)) + ns
    if "fail" in inference:
        inference["fail"]["count"] = int(inference["fail"].get("count", 0)) + q.rejected + q.cancelled
        inference["fail"]["ns"] = int(inference["fail"].get("ns", 0)) + q.rejected_ns + q.cancelled_ns
    return entry
