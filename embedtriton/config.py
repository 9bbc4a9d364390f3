"""User-facing configuration and its translation to Triton's model-config JSON.

The classes follow the names, fields and defaults of PyTriton's binding
configuration. Everything is validated here, with messages that say what to
fix, before Triton sees anything; :func:`model_config_json` is the one place
that writes Triton's config.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import InvalidArgumentError
from .tensors import triton_dtype


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

    def to_triton(self) -> dict[str, Any]:
        return {
            "timeout_action": self.timeout_action.value,
            "default_timeout_microseconds": self.default_timeout_microseconds,
            "allow_timeout_override": self.allow_timeout_override,
            "max_queue_size": self.max_queue_size,
        }


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

    def to_triton(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_queue_delay_microseconds": self.max_queue_delay_microseconds,
            "preserve_ordering": self.preserve_ordering,
        }
        if self.preferred_batch_size:
            out["preferred_batch_size"] = list(self.preferred_batch_size)
        if self.priority_levels:
            out["priority_levels"] = self.priority_levels
            out["default_priority_level"] = self.default_priority_level or self.priority_levels
        if self.default_queue_policy is not None:
            out["default_queue_policy"] = self.default_queue_policy.to_triton()
        if self.priority_queue_policy:
            out["priority_queue_policy"] = {
                str(level): policy.to_triton() for level, policy in self.priority_queue_policy.items()
            }
        return out


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

    def to_triton(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count, "kind": f"KIND_{self.kind}"}
        if self.gpus is not None:
            out["gpus"] = list(self.gpus)
        return out


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
    across the oldest sequences; ``max_candidate_sequences``, ``preferred_batch_size`` and
    ``max_queue_delay_microseconds`` apply to it). A sequence idle for longer than
    ``max_sequence_idle_microseconds`` is ended by Triton.
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

    def to_triton(self) -> dict[str, Any]:
        controls = [
            {"name": f"{CONTROL_PREFIX}{name}", "control": [{"kind": kind, "int32_false_true": [0, 1]}]}
            for name, kind in (
                ("start", "CONTROL_SEQUENCE_START"),
                ("end", "CONTROL_SEQUENCE_END"),
                ("ready", "CONTROL_SEQUENCE_READY"),
            )
        ]
        out: dict[str, Any] = {
            "max_sequence_idle_microseconds": self.max_sequence_idle_microseconds,
            "control_input": controls,
        }
        if self.iterative:
            out["iterative_sequence"] = True
        if self.strategy == "direct":
            out["direct"] = {}
        else:
            oldest: dict[str, Any] = {"max_queue_delay_microseconds": self.max_queue_delay_microseconds}
            if self.max_candidate_sequences:
                oldest["max_candidate_sequences"] = self.max_candidate_sequences
            if self.preferred_batch_size:
                oldest["preferred_batch_size"] = list(self.preferred_batch_size)
            out["oldest"] = oldest
        return out


CONTROL_PREFIX = "_embedtriton_"  # the backend turns these control inputs into Request attributes


@dataclass(frozen=True)
class ModelConfig:
    """How Triton serves a bound callable. Fields and defaults follow PyTriton's ModelConfig."""

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: list[ModelWarmup] | None = None
    instance_group: list[InstanceGroup] | None = None
    sequence_batcher: SequenceBatcher | None = None
    batch_rule: Callable[[Any, list[Any]], bool] | None = None

    def __post_init__(self) -> None:
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


MAX_DIMS = 32  # dimensions of a tensor, batch axis included (the native data path's bound)


@dataclass(frozen=True, init=False)
class Tensor:
    """An input or output of a model: ``Tensor(name=None, dtype, shape, device="cpu")``.

    ``shape`` excludes the batch axis; ``-1`` marks a variable dimension. ``dtype`` is a
    numpy dtype; ``np.bytes_`` or ``object`` means Triton BYTES. Unnamed inputs are named
    ``INPUT_1``, ``INPUT_2``, ...; unnamed outputs ``OUTPUT_1``, ...
    ``device``: where the model wants the tensor, ``"cpu"`` or ``"gpu"`` (needs a CUDA GPU).
    """

    name: str | None
    dtype: np.dtype
    shape: tuple[int, ...]
    device: str

    def __init__(
        self,
        name: str | None = None,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        device: str = "cpu",
    ):
        if dtype is None or shape is None:
            raise InvalidArgumentError("Tensor needs a dtype and a shape, e.g. Tensor(dtype=np.float32, shape=(1,))")
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidArgumentError(f"Tensor name must be a non-empty string, not {name!r}")
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"Tensor shape must be a sequence of ints, not {shape!r}") from None
        if any(d < -1 or d == 0 for d in dims):
            raise InvalidArgumentError(f"Tensor shape {dims}: dimensions must be positive or -1 (variable)")
        if len(dims) > MAX_DIMS - 1:  # room for the batch axis
            raise InvalidArgumentError(
                f"Tensor shape {dims} has {len(dims)} dimensions; at most {MAX_DIMS - 1} (plus the batch axis)"
            )
        np_dtype = np.dtype(object) if dtype in (bytes, np.bytes_, object, str) else np.dtype(dtype)
        triton_dtype(np_dtype, f"tensor {name or '(unnamed)'}")  # raises for dtypes Triton lacks
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dtype", np_dtype)
        object.__setattr__(self, "shape", dims)
        if device not in ("cpu", "gpu"):
            raise InvalidArgumentError(f"Tensor device must be 'cpu' or 'gpu', not {device!r}")
        object.__setattr__(self, "device", device)


def _non_negative(what: str, value: int) -> None:
    if not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative int, not {value!r}")


def name_tensors(tensors: Sequence[Tensor], prefix: str) -> list[Tensor]:
    """Give unnamed tensors their positional names (INPUT_1, ...) and check for duplicates."""
    named = [
        t if t.name else Tensor(name=f"{prefix}_{i}", dtype=t.dtype, shape=t.shape, device=t.device)
        for i, t in enumerate(tensors, start=1)
    ]
    names = [t.name for t in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidArgumentError(f"tensor names must be unique; repeated: {duplicates}")
    return named


def model_config_json(
    name: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig,
    backend: str,
    batch_strategy: str = "",
) -> dict[str, Any]:
    """Triton's model configuration for a bound callable."""

    def tensor(t: Tensor) -> dict[str, Any]:
        datatype = triton_dtype(t.dtype)
        return {
            "name": t.name,
            "data_type": "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype,
            "dims": list(t.shape),
        }

    out: dict[str, Any] = {
        "name": name,
        "backend": backend,
        "max_batch_size": config.max_batch_size if config.batching else 0,
        "input": [tensor(t) for t in inputs],
        "output": [tensor(t) for t in outputs],
        "instance_group": [g.to_triton() for g in config.instance_group or [InstanceGroup()]],
    }
    if config.sequence_batcher is not None:
        out["sequence_batching"] = config.sequence_batcher.to_triton()
    elif config.batching:
        out["dynamic_batching"] = config.batcher.to_triton()
    if config.response_cache:
        out["response_cache"] = {"enable": True}
    if config.decoupled:
        out["model_transaction_policy"] = {"decoupled": True}
    if config.batch_rule is not None:  # our backend library is also the batch strategy
        out["parameters"] = {"TRITON_BATCH_STRATEGY_PATH": {"string_value": batch_strategy}}
    if config.model_warmup:
        out["model_warmup"] = [warmup_json(stage, inputs) for stage in config.model_warmup]
    return out


WARMUP_FOLDER = "warmup"  # Triton reads input_data_file from <model dir>/warmup/


def warmup_file_name(stage: ModelWarmup, input_name: str) -> str:
    return f"{stage.name}-{input_name}.raw".replace("/", "_")


def warmup_json(stage: ModelWarmup, inputs: Sequence[Tensor]) -> dict[str, Any]:
    declared = {t.name: t for t in inputs}
    missing = sorted(set(declared) - set(stage.inputs))
    unknown = sorted(set(stage.inputs) - set(declared))
    if missing or unknown:
        raise InvalidArgumentError(
            f"ModelWarmup {stage.name!r}: inputs must match the model's inputs (missing: {missing}, unknown: {unknown})"
        )
    out_inputs = {}
    for name, spec in stage.inputs.items():
        datatype = triton_dtype(np.dtype(object) if spec.dtype in (bytes, np.bytes_, object, str) else spec.dtype)
        entry: dict[str, Any] = {
            "data_type": "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype,
            "dims": [int(d) for d in spec.shape],
        }
        if spec.zero_data:
            entry["zero_data"] = True
        elif spec.random_data:
            entry["random_data"] = True
        else:
            entry["input_data_file"] = warmup_file_name(stage, name)
        out_inputs[name] = entry
    return {"name": stage.name, "batch_size": stage.batch_size, "inputs": out_inputs, "count": stage.count}


def warmup_file_bytes(spec: WarmupInput) -> bytes:
    """The bytes Triton reads for a file-based warm-up input (``.npy`` files are converted)."""
    path = str(spec.input_data_file)
    try:
        if path.endswith(".npy"):
            array = np.load(path, allow_pickle=False)
            if array.dtype.kind in "OSU":
                from .tensors import encode_bytes

                return encode_bytes(array)
            return np.ascontiguousarray(array).tobytes()
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgumentError(f"warm-up input_data_file {path!r} cannot be read: {exc}") from None


@dataclass(frozen=True)
class GrpcLimits:
    """What one gRPC client may cost the endpoint (native transport; see README "Security").

    ``max_connections``: open connections; more are closed at once. ``idle_timeout_s``: a
    connection with no call and nothing received for this long is closed (GOAWAY).
    ``handshake_timeout_s``: the TLS handshake and HTTP/2 preface must be done within it.
    ``max_header_list_bytes``: request headers (metadata) per call, counted as HTTP/2 does;
    beyond, the call fails with RESOURCE_EXHAUSTED. ``max_buffered_bytes``, per connection: replies
    queued for a client that does not read them (beyond, its call is reset, RESOURCE_EXHAUSTED, and
    its requests cancelled) and request messages still arriving (memory follows the bytes received,
    never a declared length; beyond, the call fails with RESOURCE_EXHAUSTED); at least one message
    of ``max_message_bytes`` always fits.
    """

    max_connections: int = 1024
    idle_timeout_s: float = 300.0
    handshake_timeout_s: float = 10.0
    max_header_list_bytes: int = 16 * 1024
    max_buffered_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_header_list_bytes", "max_buffered_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidArgumentError(f"GrpcLimits.{name} must be a positive integer, not {value!r}")
        for name in ("idle_timeout_s", "handshake_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise InvalidArgumentError(f"GrpcLimits.{name} must be a positive number of seconds, not {value!r}")

    def transport_options(self) -> dict[str, Any]:
        """The keyword arguments of the native transport (``embedtriton._h2.Server``)."""
        return {
            "max_connections": self.max_connections,
            "idle_timeout": float(self.idle_timeout_s),
            "handshake_timeout": float(self.handshake_timeout_s),
            "max_header_list_bytes": self.max_header_list_bytes,
            "max_buffered_bytes": self.max_buffered_bytes,
        }
