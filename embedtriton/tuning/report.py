"""What a tuning run found: every trial (a configuration at a concurrency, with its measures),
the best one, the Pareto front; written as ``report.json``, ``report.png`` and
``best_config.py``, and shown as a ranked table."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import InstanceGroup, ModelConfig
from .load import Measure


@dataclass(frozen=True)
class Candidate:
    """The knobs the tuner turns (Triton's dynamic batcher, instances, response cache)."""

    max_batch_size: int
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    instances: int = 1
    response_cache: bool = False

    def config(self, base: ModelConfig) -> ModelConfig:
        """``base`` with these knobs (everything else as bound)."""
        batcher = dataclasses.replace(
            base.batcher,
            max_queue_delay_microseconds=self.max_queue_delay_microseconds,
            preferred_batch_size=list(self.preferred_batch_size) or None,
        )
        kind = base.instance_group[0].kind if base.instance_group else "CPU"
        gpus = base.instance_group[0].gpus if base.instance_group else None
        return dataclasses.replace(
            base,
            max_batch_size=self.max_batch_size if base.batching else base.max_batch_size,
            batcher=batcher,
            instance_group=[InstanceGroup(count=self.instances, kind=kind, gpus=gpus)],
            response_cache=self.response_cache,
        )

    def label(self) -> str:
        """The candidate in a few words (batch size, queue delay, preferred sizes, instances, cache)."""
        parts = [f"batch {self.max_batch_size}", f"delay {self.max_queue_delay_microseconds} µs"]
        if self.preferred_batch_size:
            parts.append(f"preferred {list(self.preferred_batch_size)}")
        parts.append(f"{self.instances} instance{'s' if self.instances > 1 else ''}")
        if self.response_cache:
            parts.append("cache")
        return ", ".join(parts)

    def source(self) -> str:
        """The ``ModelConfig(...)`` to paste (the tuned fields; keep the others as bound)."""
        batcher = [f"max_queue_delay_microseconds={self.max_queue_delay_microseconds}"]
        if self.preferred_batch_size:
            batcher.append(f"preferred_batch_size={list(self.preferred_batch_size)}")
        lines = [
            "ModelConfig(",
            f"    max_batch_size={self.max_batch_size},",
            f"    batcher=DynamicBatcher({', '.join(batcher)}),",
            f"    instance_group=[InstanceGroup(count={self.instances})],",
        ]
        if self.response_cache:
            lines.append("    response_cache=True,  # needs ServerConfig(cache_config=[...])")
        return "\n".join([*lines, ")"])


@dataclass
class Trial:
    """One configuration measured at one concurrency."""

    candidate: Candidate
    measure: Measure

    def as_dict(self) -> dict[str, Any]:
        """The trial as JSON-ready values (its candidate, label and measurements)."""
        return {"config": dataclasses.asdict(self.candidate), "label": self.candidate.label(),
                **dataclasses.asdict(self.measure)}  # fmt: skip


@dataclass
class TuningReport:
    """The tuner's findings for ``model``: ``trials`` in the order they ran, ``best`` (the highest
    throughput whose p99 is within ``latency_budget_ms``; else the lowest p99, and
    ``within_budget`` is False), ``best_config`` (the bound config with the best knobs)."""

    model: str
    base: ModelConfig
    latency_budget_ms: float | None
    via: str
    trials: list[Trial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def _fits(self, trial: Trial) -> bool:
        return self.latency_budget_ms is None or trial.measure.p99_ms <= self.latency_budget_ms

    @property
    def within_budget(self) -> bool:
        return any(self._fits(t) for t in self.trials)

    @property
    def best(self) -> Trial | None:
        fitting = [t for t in self.trials if self._fits(t)]
        if fitting:
            return max(fitting, key=lambda t: t.measure.throughput)
        return min(self.trials, key=lambda t: t.measure.p99_ms, default=None)

    @property
    def best_config(self) -> ModelConfig:
        best = self.best
        return best.candidate.config(self.base) if best else self.base

    def pareto(self) -> list[Trial]:
        """The trials no other beats on both throughput and p99 latency, by throughput."""
        front = [t for t in self.trials if not any(
            o.measure.throughput >= t.measure.throughput and o.measure.p99_ms <= t.measure.p99_ms
            and (o.measure.throughput, o.measure.p99_ms) != (t.measure.throughput, t.measure.p99_ms)
            for o in self.trials)]  # fmt: skip
        return sorted(front, key=lambda t: t.measure.throughput)

    def table(self, rows: int = 15) -> str:
        """The trials ranked (within the budget first, by throughput), as a text table."""
        ranked = sorted(self.trials, key=lambda t: (not self._fits(t), -t.measure.throughput))
        out = [f"{'#':>3}  {'infer/s':>9}  {'p50 ms':>7}  {'p99 ms':>7}  {'queue µs':>8}  {'compute µs':>10}  "
               f"{'conc':>4}  config"]  # fmt: skip
        for i, t in enumerate(ranked[:rows], 1):
            m = t.measure
            mark = "" if self._fits(t) else "  (over budget)"
            out.append(f"{i:>3}  {m.throughput:>9,.0f}  {m.p50_ms:>7.2f}  {m.p99_ms:>7.2f}  {m.queue_us:>8.0f}  "
                       f"{m.compute_us:>10.0f}  {m.concurrency:>4}  {t.candidate.label()}{mark}")  # fmt: skip
        if len(ranked) > rows:
            out.append(f"     ... {len(ranked) - rows} more in report.json")
        return "\n".join(out)

    def summary(self) -> str:
        """One line: the best trial, its gain over the config as bound, and the budget it kept."""
        best = self.best
        if best is None:
            return f"model '{self.model}': no trial completed"
        bound = self.trials[0].candidate  # the first candidate measured is the config as bound
        same = [
            t.measure for t in self.trials if t.candidate == bound and t.measure.concurrency == best.measure.concurrency
        ]
        first = same[0] if same else self.trials[0].measure
        budget = (
            f"p99 within {self.latency_budget_ms} ms" if self.latency_budget_ms is not None else "no latency budget"
        )
        verdict = "best" if self.within_budget else f"no trial met the budget ({budget}); lowest p99"
        return (f"{verdict}: {best.candidate.label()} at concurrency {best.measure.concurrency}: "
                f"{best.measure.throughput:,.0f} infer/s, p99 {best.measure.p99_ms:.2f} ms "
                f"({best.measure.throughput / max(first.throughput, 1e-9):.1f}x the config as bound at that concurrency; "
                f"{budget})")  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (what :meth:`save` writes as ``report.json``)."""
        best = self.best
        return {
            "model": self.model,
            "via": self.via,
            "latency_budget_ms": self.latency_budget_ms,
            "within_budget": self.within_budget,
            "seconds": round(self.seconds, 1),
            "best": None if best is None else {**dataclasses.asdict(best.candidate), "concurrency": best.measure.concurrency,
                                               "throughput": best.measure.throughput, "p99_ms": best.measure.p99_ms},
            "pareto": [self.trials.index(t) for t in self.pareto()],
            "trials": [t.as_dict() for t in self.trials],
            "notes": self.notes,
        }  # fmt: skip

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``report.json``, ``best_config.py`` and (with matplotlib) ``report.png``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        written = [out / "report.json", out / "best_config.py"]
        written[0].write_text(json.dumps(self.as_dict(), indent=2, default=float) + "\n")
        best = self.best
        source = best.candidate.source() if best else "ModelConfig()"
        written[1].write_text(
            f'"""The configuration the tuner chose for model {self.model!r}: {self.summary()}"""\n\n'
            "from embedtriton import DynamicBatcher, InstanceGroup, ModelConfig\n\n"
            f"config = {source}\n"
        )
        if self.plot(out / "report.png"):
            written.append(out / "report.png")
        return written

    def plot(self, path: Path) -> bool:
        """Throughput against p99 latency, every trial, the Pareto front and the budget line."""
        try:
            import matplotlib
        except ImportError:
            self.notes.append("matplotlib is not installed: no report.png (pip install matplotlib)")
            return False
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        fig, ax = plt.subplots(figsize=(8, 5))
        for c in sorted({t.measure.concurrency for t in self.trials}):
            ts = [t for t in self.trials if t.measure.concurrency == c]
            ax.scatter([t.measure.p99_ms for t in ts], [t.measure.throughput for t in ts], label=f"concurrency {c}",
                       alpha=0.7)  # fmt: skip
        front = self.pareto()
        ax.plot([t.measure.p99_ms for t in front], [t.measure.throughput for t in front], "k--", lw=1,
                label="Pareto front")  # fmt: skip
        best = self.best
        if best is not None:
            ax.scatter([best.measure.p99_ms], [best.measure.throughput], s=200, facecolors="none", edgecolors="red",
                       label=f"chosen: {best.candidate.label()}")  # fmt: skip
        if self.latency_budget_ms is not None:
            ax.axvline(self.latency_budget_ms, color="red", lw=1, label=f"budget {self.latency_budget_ms} ms")
        ax.set_xscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)  # 2, 5, 10, 20 ms rather than 2x10^0
        ax.xaxis.set_minor_formatter(
            matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else "")
        )
        ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
        ax.set_xlabel("p99 latency (ms)")
        ax.set_ylabel("throughput (infer/s)")
        ax.set_title(f"embedtriton tune: model '{self.model}' ({len(self.trials)} trials, {self.via})")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return True
