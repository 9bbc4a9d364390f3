"""The search: Model Analyzer's quick mode, in spirit, on the bound callable. Each candidate is
loaded into Triton (the model is re-bound with it) and measured at every concurrency:

1. the configuration as bound;
2. max_batch_size doubled from 1 while throughput grows (up to the highest concurrency);
3. max_queue_delay_microseconds raised while throughput grows within the latency budget;
4. the best batch size as preferred_batch_size;
5. more instances while throughput grows;
6. the response cache, where the requests repeat (samples) and the server has a cache.

The search walks on capacity (a candidate's best throughput at any concurrency: a large signal,
where the throughputs at low concurrency differ by noise alone): a step counts when it raises
the capacity by 5 % and keeps p99 within the latency budget at every concurrency where the best
so far kept it; two steps that do not count end a walk. The best configuration is then chosen
among all trials (the highest throughput within the budget). The search stops when the time
budget would be exceeded; the model gets its bound configuration back at the end."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import InvalidArgumentError, TritonError
from .load import Load, Measure, measure_grpc, measure_in_process
from .report import Candidate, Trial, TuningReport

DELAYS_US = (100, 250, 500, 1000, 2000, 4000)
GROWTH = 1.05  # a step must bring 5 % more throughput to count as growth


class Score(NamedTuple):
    capacity: float  # the best throughput, at any concurrency
    fits: frozenset[int]  # the concurrencies where p99 stays within the latency budget

    def beats(self, other: Score, need: float = 1.0) -> bool:
        """More capacity by ``need``, and within the budget wherever ``other`` is."""
        return self.capacity > other.capacity * need and self.fits >= other.fits


NONE = Score(0.0, frozenset())


def tune(
    server: Any,
    model_name: str,
    *,
    concurrency: Sequence[int] = (1, 8, 32),
    latency_budget_ms: float | None = None,
    time_budget_s: float = 120.0,
    shapes: Mapping[str, Sequence[int]] | None = None,
    samples: Mapping[str, np.ndarray] | None = None,
    via: str = "in-process",
    window_s: float = 1.0,
    max_batch_size: int | None = None,
    progress: bool = True,
) -> TuningReport:
    """Sweep Triton's batcher settings for a bound model on a running ``server`` and report
    (see :class:`TuningReport`; ``report.save(dir)`` writes ``report.json``, ``report.png`` and
    ``best_config.py``). The model keeps its bound configuration afterwards: apply the chosen one
    with ``server.load(name, report.best_config)`` or by binding with it.

    ``concurrency``: the numbers of requests in flight to measure at; ``latency_budget_ms``: the
    p99 latency a chosen configuration must keep; ``time_budget_s``: when to stop searching;
    ``shapes``: the dimensions of variable-shape inputs (without the batch axis; 1 by default);
    ``samples``: real inputs instead of random ones (one array per input, first axis the samples);
    ``via``: ``"in-process"`` or ``"grpc"`` (perf_analyzer over the gRPC endpoint);
    ``window_s``: how long each measurement lasts; ``max_batch_size``: the largest to try.
    """
    binding = server.binding(model_name)
    if binding is None:
        raise InvalidArgumentError(f"no model '{model_name}' is bound (bound: {[m.name for m in server.models()]})")
    base = binding.config
    if base.decoupled or base.sequence_batcher is not None:
        kind = "decoupled" if base.decoupled else "sequence-batched"
        raise InvalidArgumentError(
            f"model '{model_name}' is {kind}: the tuner sweeps the dynamic batcher of request/response models"
        )
    levels = sorted({int(c) for c in concurrency})
    if not levels or levels[0] < 1:
        raise InvalidArgumentError(f"concurrency must list positive numbers, not {list(concurrency)}")
    if via not in ("in-process", "grpc"):
        raise InvalidArgumentError(f"via must be 'in-process' or 'grpc', not {via!r}")
    load = Load(binding.inputs, base.batching and base.max_batch_size > 0, shapes, samples)
    measure = _measurer(server, model_name, load, via, window_s)
    report = TuningReport(model_name, base, latency_budget_ms, via)
    search = _Search(server, model_name, base, levels, measure, report, time_budget_s, progress)
    try:
        search.run(load, max_batch_size or (1 << (max(levels) - 1).bit_length()), _has_cache(server))
    finally:
        search.finish()
    return report


def _has_cache(server: Any) -> bool:
    return bool(getattr(server.config, "cache_config", None))


def _measurer(server: Any, name: str, load: Load, via: str, window_s: float) -> Callable[[int], Measure]:
    model = server.model(name)
    if via == "in-process":
        return lambda c: measure_in_process(model, load, c, window_s)
    from .perf import perf_analyzer

    binary, env = perf_analyzer()
    endpoint = server.endpoint("grpc")
    port = endpoint.port if endpoint is not None else server.serve_grpc("127.0.0.1:0")
    return lambda c: measure_grpc(model, load, c, window_s, binary, env, f"127.0.0.1:{port}")


class _Search:
    def __init__(self, server: Any, name: str, base: Any, levels: list[int], measure: Callable[[int], Measure],
                 report: TuningReport, time_budget_s: float, progress: bool) -> None:  # fmt: skip
        self.server, self.name, self.base, self.levels = server, name, base, levels
        self.measure, self.report, self.budget, self.progress = measure, report, time_budget_s, progress
        self.started = time.monotonic()
        self.scores: dict[Candidate, Score] = {}
        self.cost = 0.0  # seconds the last candidate took (to see whether the next fits the budget)
        self.stopped = False

    def score(self, candidate: Candidate) -> Score:
        """The candidate measured at every concurrency (NONE: not measured)."""
        if candidate in self.scores:
            return self.scores[candidate]
        if self.stopped or time.monotonic() - self.started + self.cost > self.budget:
            if not self.stopped:
                self.report.notes.append(f"time budget of {self.budget:g} s reached: the search stopped there")
            self.stopped = True
            return NONE
        began = time.monotonic()
        try:
            self.server.load(self.name, candidate.config(self.base))
        except TritonError as exc:
            self.report.notes.append(f"{candidate.label()}: Triton refused it: {exc}")
            self.scores[candidate] = NONE
            return NONE
        capacity, fits = 0.0, set()
        for c in self.levels:
            try:
                m = self.measure(c)
            except TritonError as exc:  # (perf_analyzer failed): the first says what is wrong, later ones are noted
                if not self.report.trials:
                    raise
                self.report.notes.append(f"{candidate.label()} at concurrency {c}: not measured: {exc}")
                continue
            trial = Trial(candidate, m)
            self.report.trials.append(trial)
            capacity = max(capacity, m.throughput)
            if self.report._fits(trial):
                fits.add(c)
            self._show(trial)
        self.cost = time.monotonic() - began
        self.scores[candidate] = Score(capacity, frozenset(fits))
        return self.scores[candidate]

    def grow(self, start: Candidate, steps: Sequence[Candidate]) -> Candidate:
        """Walk ``steps`` from ``start`` while they beat the best so far by GROWTH (one miss allowed)."""
        best, best_score, flat = start, self.score(start), 0
        for step in steps:
            s = self.score(step)
            if self.stopped:
                break
            if s.beats(best_score, GROWTH):
                best, best_score, flat = step, s, 0
            else:
                flat += 1
                if flat == 2:  # growth has stopped
                    break
        return best

    def run(self, load: Load, largest: int, has_cache: bool) -> None:
        b = self.base
        bound = Candidate(
            b.max_batch_size if b.batching else 0,
            b.batcher.max_queue_delay_microseconds,
            tuple(b.batcher.preferred_batch_size or ()),
            sum(g.count for g in b.instance_group) if b.instance_group else 1,
            b.response_cache,
        )
        self.score(bound)
        best = bound
        if b.batching and b.max_batch_size > 0:
            sizes = [1 << k for k in range(max(1, largest).bit_length())]
            best = self.grow(Candidate(1), [Candidate(n) for n in sizes[1:]])
            best = self._better(bound, best)
            delays = [d for d in DELAYS_US if d > best.max_queue_delay_microseconds]
            best = self.grow(best, [_with(best, max_queue_delay_microseconds=d) for d in delays])
            if best.max_batch_size > 1 and not best.preferred_batch_size:
                best = self._better(best, _with(best, preferred_batch_size=(best.max_batch_size,)))
        else:
            self.report.notes.append(
                f"model '{self.name}' is bound without batching: only instances are swept (bind it with "
                "max_batch_size >= 1 and a batch axis to let the tuner sweep batching)"
            )
        cpus = os.cpu_count() or 1
        counts = [n for n in (2, 4, 8) if n <= max(2, cpus)]
        best = self.grow(best, [_with(best, instances=n) for n in counts])
        if load.repeats and has_cache:
            best = self._better(best, _with(best, response_cache=True))
        elif load.repeats:
            self.report.notes.append("the samples repeat, but the server has no cache_config: the cache was not tried")

    def _better(self, a: Candidate, b: Candidate) -> Candidate:
        return b if self.score(b).beats(self.score(a)) else a

    def _show(self, trial: Trial) -> None:
        if not self.progress:
            return
        elapsed = time.monotonic() - self.started
        done = min(1.0, elapsed / self.budget)
        bar = "#" * int(done * 20) + "." * (20 - int(done * 20))
        m = trial.measure
        sys.stderr.write(
            f"\r[{bar}] {elapsed:5.1f}/{self.budget:g} s  trial {len(self.report.trials):3d}: "
            f"{trial.candidate.label()}, concurrency {m.concurrency}: {m.throughput:,.0f} infer/s, "
            f"p99 {m.p99_ms:.2f} ms\033[K"
        )
        sys.stderr.flush()

    def finish(self) -> None:
        self.report.seconds = time.monotonic() - self.started
        if self.progress:
            sys.stderr.write("\n")
        try:
            self.server.load(self.name, self.base)  # the model as it was bound
        except TritonError as exc:
            self.report.notes.append(f"restoring the bound configuration failed: {exc}")


def _with(candidate: Candidate, **changes: Any) -> Candidate:
    return dataclasses.replace(candidate, **changes)
