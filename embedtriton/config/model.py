"""How Triton serves a bound callable: the user's declarations, validated.

The classes follow the names, fields and defaults of PyTriton's binding configuration.
Everything is checked here, with messages that say what to fix, before Triton sees anything;
:mod:`.triton_json` is the one place that writes Triton's config from them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError


class TimeoutAction(enum.Enum):
    """What Triton does with a request whose queue timeout expires."""

    REJECT = "REJECT"  # fail it with UNAVAILABLE
    DELAY = "DELAY"  # keep it, behind requests that did not time out


@dataclass(frozen=True)
class QueuePolicy:
    """A dynamic-batcher queue's policy (Triton's ModelQueuePolicy)."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.timeout_action, TimeoutAction):
            raise InvalidArgumentError(
                f"QueuePolicy.timeout_action must be TimeoutAction.REJECT or DELAY, not {self.timeout_action!r}"
            )
        _non_negative("QueuePolicy.default_timeout_microseconds", self.default_timeout_microseconds)
        _non_negative("QueuePolicy.max_queue_size", self.max_queue_size)


@dataclass(frozen=True)
class DynamicBatcher:
    """Triton's dynamic batcher settings (ModelDynamicBatching)."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: list[int] | None = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: dict[int, QueuePolicy] | None = None

    def __post_init__(self) -> None:
        _non_negative("DynamicBatcher.max_queue_delay_microseconds", self.max_queue_delay_microseconds)
        _non_negative("DynamicBatcher.priority_levels", self.priority_levels)
        if self.priority_levels and not 0 <= self.default_priority_level <= self.priority_levels:
            raise InvalidArgumentError(
                f"DynamicBatcher.default_priority_level={self.default_priority_level} must be "
                f"between 1 and priority_levels={self.priority_levels}"
            )
        if self.preserve_ordering and self.priority_levels > 1:
            raise InvalidArgumentError(
                "DynamicBatcher: Triton allows only one priority level with preserve_ordering=True"
            )
        for level in self.priority_queue_policy or {}:
            if not 1 <= level <= self.priority_levels:
                raise InvalidArgumentError(
                    f"DynamicBatcher.priority_queue_policy has level {level}; levels go from 1 "
                    f"to priority_levels={self.priority_levels}"
                )


@dataclass(frozen=True)
class InstanceGroup:
    """A group of model instances (Triton's instance_group): ``count`` copies of the model on
    ``kind`` ("CPU" or "GPU", the latter on ``gpus``) that run batches concurrently."""

    count: int = 1
    kind: str = "CPU"
    gpus: list[int] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 1:
            raise InvalidArgumentError(f"InstanceGroup.count must be >= 1, not {self.count!r}")
        if self.kind not in ("CPU", "GPU"):
            raise InvalidArgumentError(f"InstanceGroup.kind must be 'CPU' or 'GPU', not {self.kind!r}")
        if self.gpus is not None and self.kind != "GPU":
            raise InvalidArgumentError("InstanceGroup.gpus is only meaningful with kind='GPU'")


@dataclass(frozen=True)
class WarmupInput:
    """Synthetic data for one input of a warm-up request: exactly one of ``zero_data``,
    ``random_data`` or ``input_data_file`` (a ``.npy`` file, or raw bytes in Triton's layout)."""

    dtype: Any
    shape: Sequence[int]
    zero_data: bool = False
    random_data: bool = False
    input_data_file: str | None = None

    def __post_init__(self) -> None:
        sources = [self.zero_data, self.random_data, self.input_data_file is not None]
        if sum(sources) != 1:
            raise InvalidArgumentError(
                "WarmupInput needs exactly one data source: zero_data=True, random_data=True or "
                f"input_data_file=PATH (got zero_data={self.zero_data}, random_data={self.random_data}, "
                f"input_data_file={self.input_data_file!r})"
            )


@dataclass(frozen=True)
class ModelWarmup:
    """One warm-up stage: ``count`` requests of ``batch_size`` that Triton runs through the
    model after loading it and before reporting it READY."""

    name: str
    batch_size: int
    inputs: dict[str, WarmupInput]
    count: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise InvalidArgumentError(f"ModelWarmup {self.name!r}: batch_size must be >= 1")
        if not isinstance(self.count, int) or self.count < 1:
            raise InvalidArgumentError(f"ModelWarmup {self.name!r}: count must be >= 1")
        if not self.inputs:
            raise InvalidArgumentError(f"ModelWarmup {self.name!r}: inputs must name every model input")


@dataclass(frozen=True)
class SequenceBatcher:
    """Triton's sequence batcher, for stateful models: every request of a sequence (one
    correlation id) reaches the same model instance, in order.

    ``strategy``: "direct" (one batch slot per sequence) or "oldest" (dynamic batching
    across the oldest sequences; ``max_candidate_sequences`` and ``preferred_batch_size``
    apply to it). ``max_queue_delay_microseconds``: how long a batch may wait to fill (both). A sequence idle for longer than
    ``max_sequence_idle_microseconds`` is ended by Triton; with ``iterative=True`` an iteration
    counts as idle time, so give such a model a limit longer than its slowest iteration.
    """

    strategy: str = "direct"
    max_sequence_idle_microseconds: int = 1_000_000
    max_candidate_sequences: int | None = None
    preferred_batch_size: list[int] | None = None
    max_queue_delay_microseconds: int = 0
    iterative: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in ("direct", "oldest"):
            raise InvalidArgumentError(f"SequenceBatcher.strategy must be 'direct' or 'oldest', not {self.strategy!r}")
        _non_negative("SequenceBatcher.max_sequence_idle_microseconds", self.max_sequence_idle_microseconds)
        _non_negative("SequenceBatcher.max_queue_delay_microseconds", self.max_queue_delay_microseconds)
        if self.strategy == "direct" and (self.max_candidate_sequences or self.preferred_batch_size):
            raise InvalidArgumentError(
                "SequenceBatcher: max_candidate_sequences and preferred_batch_size apply to strategy='oldest'"
            )


@dataclass(frozen=True)
class VersionPolicy:
    """Which of a model's bound versions Triton serves (Triton's ``version_policy``):
    ``VersionPolicy.latest(n)`` the n highest (the default, n=1), ``VersionPolicy.all()``,
    ``VersionPolicy.specific(1, 3)`` those listed."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("latest", "all", "specific"):
            raise InvalidArgumentError(
                "VersionPolicy: use VersionPolicy.latest(n), VersionPolicy.all() or VersionPolicy.specific(*versions)"
            )
        if self.kind == "latest" and (not isinstance(self.num_versions, int) or self.num_versions < 1):
            raise InvalidArgumentError(f"VersionPolicy.latest(n) needs n >= 1, not {self.num_versions!r}")
        if self.kind == "specific" and (
            not self.versions
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in self.versions)
        ):
            raise InvalidArgumentError(f"VersionPolicy.specific(...) needs versions >= 1, not {self.versions!r}")

    @classmethod
    def latest(cls, num_versions: int = 1) -> VersionPolicy:
        """Serve the ``num_versions`` highest versions (Triton's default: the latest one)."""
        return cls("latest", num_versions)

    @classmethod
    def all(cls) -> VersionPolicy:
        """Serve every bound version."""
        return cls("all")

    @classmethod
    def specific(cls, *versions: int) -> VersionPolicy:
        """Serve these versions only."""
        return cls("specific", versions=tuple(versions))

    def serves_one(self) -> bool:
        """Whether at most one version is loaded at a time."""
        return (self.kind == "latest" and self.num_versions == 1) or (
            self.kind == "specific" and len(self.versions) == 1
        )


GPU_ARRAYS = ("cupy", "torch", "dlpack")


@dataclass(frozen=True)
class ModelConfig:
    """How Triton serves a bound callable. Fields and defaults follow PyTriton's ModelConfig.

    ``gpu_arrays``: what the callable gets for an input in GPU memory, with no copy: ``"cupy"``
    arrays (the default), ``"torch"`` tensors, or ``"dlpack"`` (embedtriton's ``DeviceArray``,
    for any library's ``from_dlpack``). Host inputs are numpy arrays whatever it says.
    """

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: list[ModelWarmup] | None = None
    instance_group: list[InstanceGroup] | None = None
    sequence_batcher: SequenceBatcher | None = None
    batch_rule: Callable[[Any, list[Any]], bool] | None = None
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    gpu_arrays: str = "cupy"

    def __post_init__(self) -> None:
        if self.gpu_arrays not in GPU_ARRAYS:
            raise InvalidArgumentError(
                f"ModelConfig.gpu_arrays must be one of {list(GPU_ARRAYS)} (how the callable gets inputs "
                f"that are in GPU memory), not {self.gpu_arrays!r}"
            )
        if not isinstance(self.version_policy, VersionPolicy):
            raise InvalidArgumentError(
                f"ModelConfig.version_policy must be a VersionPolicy (e.g. VersionPolicy.all()), not {self.version_policy!r}"
            )
        if self.batching and (not isinstance(self.max_batch_size, int) or self.max_batch_size < 1):
            raise InvalidArgumentError(
                f"ModelConfig.max_batch_size must be >= 1 when batching (got {self.max_batch_size!r}); "
                "pass batching=False for a model without a batch axis"
            )
        if not isinstance(self.batcher, DynamicBatcher):
            raise InvalidArgumentError(f"ModelConfig.batcher must be a DynamicBatcher, not {self.batcher!r}")
        if self.sequence_batcher is not None and not isinstance(self.sequence_batcher, SequenceBatcher):
            raise InvalidArgumentError(
                f"ModelConfig.sequence_batcher must be a SequenceBatcher, not {self.sequence_batcher!r}"
            )
        if self.batch_rule is not None:
            if not callable(self.batch_rule):
                raise InvalidArgumentError("ModelConfig.batch_rule must be callable: rule(candidate, batch) -> bool")
            if not self.batching or self.sequence_batcher is not None:
                raise InvalidArgumentError(
                    "ModelConfig.batch_rule shapes the dynamic batcher's batches: it needs batching=True "
                    "and no sequence_batcher"
                )
        if self.sequence_batcher is not None and self.sequence_batcher.iterative and not self.decoupled:
            raise InvalidArgumentError(
                "SequenceBatcher(iterative=True) streams each step: the model needs decoupled=True"
            )
        if not self.batching and self.batcher.preferred_batch_size:
            raise InvalidArgumentError(
                "DynamicBatcher.preferred_batch_size needs batching=True (without batching the "
                "batcher only queues: priorities and queue policies)"
            )
        if self.batching:  # Triton would refuse these only when it loads the model
            for what, sizes in (
                ("DynamicBatcher", self.batcher.preferred_batch_size),
                ("SequenceBatcher", self.sequence_batcher and self.sequence_batcher.preferred_batch_size),
            ):
                bad = [s for s in sizes or [] if not isinstance(s, int) or not 1 <= s <= self.max_batch_size]
                if bad:
                    raise InvalidArgumentError(
                        f"{what}.preferred_batch_size {list(sizes)}: {bad} not between 1 and "  # type: ignore[arg-type]
                        f"max_batch_size={self.max_batch_size}; lower them or raise max_batch_size"
                    )
        if self.decoupled and self.response_cache:
            raise InvalidArgumentError("Triton's response cache does not serve decoupled models")
        for group in self.instance_group or []:
            if not isinstance(group, InstanceGroup):
                raise InvalidArgumentError(f"ModelConfig.instance_group takes InstanceGroup items, not {group!r}")
        for stage in self.model_warmup or []:
            if not isinstance(stage, ModelWarmup):
                raise InvalidArgumentError(f"ModelConfig.model_warmup takes ModelWarmup items, not {stage!r}")
            if not self.batching and stage.batch_size != 1:
                raise InvalidArgumentError(
                    f"ModelWarmup {stage.name!r}: batch_size must be 1 for a model without batching"
                )
            if self.batching and stage.batch_size > self.max_batch_size:
                raise InvalidArgumentError(
                    f"ModelWarmup {stage.name!r}: batch_size {stage.batch_size} exceeds max_batch_size "
                    f"{self.max_batch_size}"
                )


def _non_negative(what: str, value: int) -> None:
    if not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative int, not {value!r}")
