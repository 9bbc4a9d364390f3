"""The one writer of Triton's model configuration (JSON) from the user's declarations.

Pure functions of the declarations: testable without the runtime (golden files in
``tests/unit/golden/``). The server passes the result as the ``config`` parameter of
``TRITONSERVER_ServerLoadModelWithParameters``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..tensors import BY_NAME, as_numpy_dtype, encode_bytes, triton_dtype
from .model import (
    DynamicBatcher,
    InstanceGroup,
    ModelConfig,
    ModelWarmup,
    QueuePolicy,
    SequenceBatcher,
    VersionPolicy,
    WarmupInput,
)
from .tensor import Tensor, name_of

CONTROL_PREFIX = "_embedtriton_"  # the backend turns these control inputs into Request attributes
WARMUP_FOLDER = "warmup"  # Triton reads input_data_file from <model dir>/warmup/


def model_config_json(
    name: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig,
    backend: str,
    batch_strategy: str = "",
) -> dict[str, Any]:
    """Triton's model configuration for a bound callable."""
    out: dict[str, Any] = {
        "name": name,
        "backend": backend,
        "max_batch_size": config.max_batch_size if config.batching else 0,
        "input": [tensor_json(t) for t in inputs],
        "output": [_output(i, t) for i, t in enumerate(outputs)],
        "instance_group": [_instance_group(g) for g in config.instance_group or [InstanceGroup()]],
    }
    if config.sequence_batcher is not None:
        out["sequence_batching"] = _sequence_batching(config.sequence_batcher)
    elif has_dynamic_batcher(config):
        out["dynamic_batching"] = _dynamic_batching(config.batcher)
    if config.response_cache:
        out["response_cache"] = {"enable": True}
    if config.decoupled:
        out["model_transaction_policy"] = {"decoupled": True}
    if config.batch_rule is not None:  # our backend library is also the batch strategy
        out["parameters"] = {"TRITON_BATCH_STRATEGY_PATH": {"string_value": batch_strategy}}
    if config.model_warmup:
        out["model_warmup"] = [warmup_json(stage, inputs) for stage in config.model_warmup]
    policy = config.version_policy
    if policy != VersionPolicy():  # Triton's default: latest(1)
        if policy.kind == "latest":
            out["version_policy"] = {"latest": {"num_versions": policy.num_versions}}
        elif policy.kind == "all":
            out["version_policy"] = {"all": {}}
        else:
            out["version_policy"] = {"specific": {"versions": list(policy.versions)}}
    return out


def _config_type(dtype: Any) -> str:
    return BY_NAME[triton_dtype(dtype)].config_type


def tensor_json(t: Tensor) -> dict[str, Any]:
    """A tensor's entry in a model config's ``input`` or ``output``."""
    out: dict[str, Any] = {"name": t.name, "data_type": _config_type(t.dtype), "dims": list(t.shape)}
    if t.optional:  # (inputs only: bind refuses optional outputs)
        out["optional"] = True
    if t.format is not None:  # (inputs only, as optional)
        out["format"] = f"FORMAT_{t.format}"
    return out


def labels_file_name(index: int) -> str:
    """The file, in the model's folder, that holds output ``index``'s class labels."""
    return f"labels_{index}.txt"


def _output(index: int, t: Tensor) -> dict[str, Any]:
    out = tensor_json(t)
    if t.labels is not None:
        out["label_filename"] = labels_file_name(index)
    return out


def _instance_group(group: InstanceGroup) -> dict[str, Any]:
    out: dict[str, Any] = {"count": group.count, "kind": f"KIND_{group.kind}"}
    if group.gpus is not None:
        out["gpus"] = list(group.gpus)
    return out


def _queue_policy(policy: QueuePolicy) -> dict[str, Any]:
    return {
        "timeout_action": policy.timeout_action.value,
        "default_timeout_microseconds": policy.default_timeout_microseconds,
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size,
    }


def has_dynamic_batcher(config: ModelConfig) -> bool:
    """Whether Triton's config for the model has a dynamic batcher (a sequence batcher rules it
    out). Without batching it still queues: priorities, queue policies."""
    return config.sequence_batcher is None and (config.batching or config.batcher != DynamicBatcher())


def _dynamic_batching(batcher: DynamicBatcher) -> dict[str, Any]:
    out: dict[str, Any] = {
        "max_queue_delay_microseconds": batcher.max_queue_delay_microseconds,
        "preserve_ordering": batcher.preserve_ordering,
    }
    if batcher.preferred_batch_size:
        out["preferred_batch_size"] = list(batcher.preferred_batch_size)
    if batcher.priority_levels:
        out["priority_levels"] = batcher.priority_levels
        out["default_priority_level"] = batcher.default_priority_level or batcher.priority_levels
    if batcher.default_queue_policy is not None:
        out["default_queue_policy"] = _queue_policy(batcher.default_queue_policy)
    if batcher.priority_queue_policy:
        out["priority_queue_policy"] = {
            str(level): _queue_policy(policy) for level, policy in batcher.priority_queue_policy.items()
        }
    return out


def _sequence_batching(batcher: SequenceBatcher) -> dict[str, Any]:
    controls = [
        {"name": f"{CONTROL_PREFIX}{name}", "control": [{"kind": kind, "int32_false_true": [0, 1]}]}
        for name, kind in (
            ("start", "CONTROL_SEQUENCE_START"),
            ("end", "CONTROL_SEQUENCE_END"),
            ("ready", "CONTROL_SEQUENCE_READY"),
        )
    ]
    out: dict[str, Any] = {
        "max_sequence_idle_microseconds": batcher.max_sequence_idle_microseconds,
        "control_input": controls,
    }
    if batcher.iterative:
        out["iterative_sequence"] = True
    if batcher.strategy == "direct":
        delay = batcher.max_queue_delay_microseconds  # how long a slot's batch may wait to fill
        out["direct"] = {"max_queue_delay_microseconds": delay} if delay else {}
    else:
        oldest: dict[str, Any] = {"max_queue_delay_microseconds": batcher.max_queue_delay_microseconds}
        if batcher.max_candidate_sequences:
            oldest["max_candidate_sequences"] = batcher.max_candidate_sequences
        if batcher.preferred_batch_size:
            oldest["preferred_batch_size"] = list(batcher.preferred_batch_size)
        out["oldest"] = oldest
    return out


def warmup_file_name(stage: ModelWarmup, input_name: str) -> str:
    return f"{stage.name}-{input_name}.raw".replace("/", "_")


def warmup_json(stage: ModelWarmup, inputs: Sequence[Tensor]) -> dict[str, Any]:
    declared = {name_of(t): t for t in inputs}
    missing = sorted(set(declared) - set(stage.inputs))
    unknown = sorted(set(stage.inputs) - set(declared))
    if missing or unknown:
        raise InvalidArgumentError(
            f"ModelWarmup {stage.name!r}: inputs must match the model's inputs (missing: {missing}, unknown: {unknown})"
        )
    out_inputs = {}
    for name, spec in stage.inputs.items():
        _check_warmup_input(stage, name, spec, declared[name])
        entry: dict[str, Any] = {
            "data_type": _config_type(as_numpy_dtype(spec.dtype)),
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


def _check_warmup_input(stage: ModelWarmup, name: str, spec: WarmupInput, tensor: Tensor) -> None:
    """A warm-up input must be a valid request for the input it feeds (Triton fails the load
    otherwise, and Triton 2.51 crashes the process when a warm-up request fails)."""
    where = f"ModelWarmup {stage.name!r}, input {name!r}"
    dtype = as_numpy_dtype(spec.dtype)
    if triton_dtype(dtype) != triton_dtype(tensor.dtype):
        raise InvalidArgumentError(
            f"{where}: dtype {triton_dtype(dtype)} but the input is {triton_dtype(tensor.dtype)}; give the input's dtype"
        )
    dims = tuple(int(d) for d in spec.shape)
    fits = len(dims) == len(tensor.shape) and all(
        d > 0 and t in (-1, d) for d, t in zip(dims, tensor.shape, strict=True)
    )
    if not fits:
        raise InvalidArgumentError(
            f"{where}: shape {list(dims)} does not fit the input's shape {list(tensor.shape)} (without the batch "
            "axis; every -1 needs a size)"
        )


def warmup_file_bytes(spec: WarmupInput) -> bytes:
    """The bytes Triton reads for a file-based warm-up input (``.npy`` files are converted)."""
    path = str(spec.input_data_file)
    try:
        if path.endswith(".npy"):
            array = np.load(path, allow_pickle=False)
            if array.dtype.kind in "OSU":
                return encode_bytes(array)
            return np.ascontiguousarray(array).tobytes()
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgumentError(f"warm-up input_data_file {path!r} cannot be read: {exc}") from None
