"""Ensembles: a DAG of models that Triton's ensemble scheduler runs as one model.

:class:`Step` is what the user writes; :func:`ensemble_config_json` checks the graph against
the step models' declarations (every mistake named before Triton sees it) and writes Triton's
``ensemble_scheduling`` config. Pure functions of the declarations, like :mod:`.triton_json`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from ..tensors import triton_dtype
from .model import DynamicBatcher, ModelConfig
from .tensor import Tensor, name_of
from .triton_json import tensor_json


@dataclass(frozen=True, init=False)
class Step:
    """One step of an ensemble: run ``model_name`` (``version`` -1: the one Triton picks).

    ``inputs`` maps the step model's input names to ensemble tensors, ``outputs`` the step
    model's output names to ensemble tensors: the direction of Triton's ``input_map`` and
    ``output_map``. An ensemble tensor is an ensemble input, an ensemble output, or a name
    that links one step's output to later steps' inputs.
    """

    model_name: str
    inputs: dict[str, str]
    outputs: dict[str, str]
    version: int

    def __init__(
        self, model_name: str, inputs: Mapping[str, str], outputs: Mapping[str, str], version: int = -1
    ) -> None:
        if not isinstance(model_name, str) or not model_name:
            raise InvalidArgumentError(f"Step model_name must be a model's name, not {model_name!r}")
        for what, mapping in (("inputs", inputs), ("outputs", outputs)):
            if not isinstance(mapping, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) and v for k, v in mapping.items()
            ):
                raise InvalidArgumentError(
                    f"Step({model_name!r}) {what} must map the model's tensor names to ensemble tensor names "
                    f"(strings), e.g. {{'x': 'TEXT'}}; got {mapping!r}"
                )
        if not outputs:
            raise InvalidArgumentError(f"Step({model_name!r}) maps no output: a step must produce something")
        if not isinstance(version, int) or isinstance(version, bool) or (version < 1 and version != -1):
            raise InvalidArgumentError(f"Step({model_name!r}) version must be -1 (latest) or >= 1, not {version!r}")
        object.__setattr__(self, "model_name", model_name)
        object.__setattr__(self, "inputs", dict(inputs))
        object.__setattr__(self, "outputs", dict(outputs))
        object.__setattr__(self, "version", version)


@dataclass(frozen=True)
class StepModel:
    """What a step needs to know of the model it runs (the bound model's declarations)."""

    inputs: Sequence[Tensor]
    outputs: Sequence[Tensor]
    max_batch_size: int  # 0: no batch axis
    decoupled: bool = False


class _Tensor:
    """An ensemble tensor as the graph sees it: its dtype, shapes, producer and readers."""

    def __init__(self, dtype: str, dims: tuple[int, ...], batching: bool, origin: str) -> None:
        self.dtype, self.dims, self.origin = dtype, dims, origin
        self.full = ((-1,) if batching else ()) + dims
        self.producer: int | None = None  # step index; None for an ensemble input
        self.readers: list[int] = []


def _fits(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _merge(tensors: dict[str, _Tensor], name: str, seen: _Tensor, where: str) -> None:
    known = tensors.get(name)
    if known is None:
        tensors[name] = seen
        return
    if known.dtype != seen.dtype:
        raise InvalidArgumentError(
            f"{where}: ensemble tensor '{name}' is {known.dtype} for {known.origin} but {seen.dtype} for {seen.origin}"
        )
    if not _fits(known.dims, seen.dims) and not _fits(known.full, seen.full):
        raise InvalidArgumentError(
            f"{where}: ensemble tensor '{name}' has shape {list(known.full)} for {known.origin} but "
            f"{list(seen.full)} for {seen.origin} (-1: any size; the batch axis counted)"
        )


def ensemble_config_json(
    name: str,
    steps: Sequence[Step],
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig,
    models: Mapping[str, StepModel],
) -> dict[str, Any]:
    """Triton's config for ensemble ``name``, after checking its graph; ``models`` holds the
    declarations of the models the steps name (bound models)."""
    _check_config(name, config)
    if not steps or not all(isinstance(s, Step) for s in steps):
        raise InvalidArgumentError(f"ensemble '{name}' needs steps=[Step(...), ...]")
    batching = config.batching
    tensors: dict[str, _Tensor] = {}
    for t in inputs:
        tensors[t.name] = _Tensor(triton_dtype(t.dtype), t.shape, batching, f"ensemble input '{t.name}'")  # type: ignore[index]
    produced: dict[str, int] = {}
    input_names = {t.name for t in inputs}
    for index, step in enumerate(steps):
        where = f"ensemble '{name}', step {index + 1} ({step.model_name})"
        model = models.get(step.model_name)
        if model is None:
            raise InvalidArgumentError(
                f"{where}: no model '{step.model_name}' is bound; bind the step models before the ensemble "
                f"(bound: {sorted(models)})"
            )
        if model.max_batch_size and batching and model.max_batch_size < config.max_batch_size:
            raise InvalidArgumentError(
                f"{where}: the ensemble takes batches of {config.max_batch_size} but '{step.model_name}' only "
                f"{model.max_batch_size}; lower the ensemble's max_batch_size or raise the model's"
            )
        declared_in = {name_of(t): t for t in model.inputs}
        declared_out = {name_of(t): t for t in model.outputs}
        unknown = sorted(set(step.inputs) - set(declared_in))
        if unknown:
            raise InvalidArgumentError(
                f"{where}: '{step.model_name}' has no input {unknown} (inputs: {sorted(declared_in)})"
            )
        unmapped = sorted(set(declared_in) - set(step.inputs))
        if unmapped:
            raise InvalidArgumentError(
                f"{where}: input {unmapped} of '{step.model_name}' is not mapped to an ensemble tensor"
            )
        unknown = sorted(set(step.outputs) - set(declared_out))
        if unknown:
            raise InvalidArgumentError(
                f"{where}: '{step.model_name}' has no output {unknown} (outputs: {sorted(declared_out)})"
            )
        for model_input, tensor_name in step.inputs.items():
            t = declared_in[model_input]
            seen = _Tensor(
                triton_dtype(t.dtype),
                t.shape,
                model.max_batch_size > 0,
                f"input '{model_input}' of '{step.model_name}'",
            )
            _merge(tensors, tensor_name, seen, where)
            tensors[tensor_name].readers.append(index)
        targets = list(step.outputs.values())
        if len(set(targets)) != len(targets):
            raise InvalidArgumentError(
                f"{where}: two outputs of '{step.model_name}' are mapped to the same ensemble tensor"
            )
        for model_output, tensor_name in step.outputs.items():
            if tensor_name in produced or tensor_name in input_names:
                first = f"step {produced[tensor_name] + 1}" if tensor_name in produced else "an ensemble input"
                raise InvalidArgumentError(
                    f"{where}: ensemble tensor '{tensor_name}' is produced twice (it is also {first}); "
                    "give it another name"
                )
            t = declared_out[model_output]
            seen = _Tensor(
                triton_dtype(t.dtype),
                t.shape,
                model.max_batch_size > 0,
                f"output '{model_output}' of '{step.model_name}'",
            )
            _merge(tensors, tensor_name, seen, where)
            tensors[tensor_name].producer = index
            produced[tensor_name] = index
    for t in outputs:
        seen = _Tensor(triton_dtype(t.dtype), t.shape, batching, f"ensemble output '{t.name}'")
        if t.name not in produced:
            raise InvalidArgumentError(f"ensemble '{name}': no step produces its output '{t.name}'")
        _merge(tensors, name_of(t), seen, f"ensemble '{name}'")
    for tensor_name, tensor in tensors.items():
        if tensor_name in input_names and not tensor.readers and tensor_name not in {t.name for t in outputs}:
            raise InvalidArgumentError(f"ensemble '{name}': no step reads its input '{tensor_name}'")
        if tensor_name not in input_names and tensor.producer is None:
            raise InvalidArgumentError(
                f"ensemble '{name}': step {tensor.readers[0] + 1} reads '{tensor_name}', which is neither an "
                "ensemble input nor any step's output"
            )
    streaming = sorted({s.model_name for s in steps if models[s.model_name].decoupled})
    if streaming and not config.decoupled:
        raise InvalidArgumentError(
            f"ensemble '{name}': step model {streaming} is decoupled (it streams responses); bind the ensemble "
            "with ModelConfig(decoupled=True) and call stream(), or every response but one is lost"
        )
    _check_acyclic(name, steps, produced)
    _check_decoupled(name, steps, models, input_names)  # type: ignore[arg-type]
    out: dict[str, Any] = {
        "name": name,
        "platform": "ensemble",
        "max_batch_size": config.max_batch_size if batching else 0,
        "input": [tensor_json(t) for t in inputs],
        "output": [tensor_json(t) for t in outputs],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": s.model_name,
                    "model_version": s.version,
                    "input_map": dict(s.inputs),
                    "output_map": dict(s.outputs),
                }
                for s in steps
            ]
        },
    }
    if config.response_cache:
        out["response_cache"] = {"enable": True}
    if config.decoupled:
        out["model_transaction_policy"] = {"decoupled": True}
    return out


def _check_config(name: str, config: ModelConfig) -> None:
    """An ensemble has no batcher or instances of its own: its steps do."""
    own = {
        "batcher": config.batcher != DynamicBatcher(),
        "sequence_batcher": config.sequence_batcher is not None,
        "instance_group": bool(config.instance_group),
        "model_warmup": bool(config.model_warmup),
        "batch_rule": config.batch_rule is not None,
    }
    given = sorted(k for k, v in own.items() if v)
    if given:
        raise InvalidArgumentError(
            f"ensemble '{name}': {given} belong to the step models (an ensemble has no batcher, instances or "
            "warm-up of its own); an ensemble's ModelConfig takes batching, max_batch_size, decoupled and "
            "response_cache"
        )


def _check_acyclic(name: str, steps: Sequence[Step], produced: Mapping[str, int]) -> None:
    """Steps form a DAG: no step (indirectly) reads what it produces."""
    after: dict[int, set[int]] = {i: set() for i in range(len(steps))}  # step -> steps it feeds
    for index, step in enumerate(steps):
        for tensor_name in step.inputs.values():
            if tensor_name in produced:
                after[produced[tensor_name]].add(index)
    state: dict[int, int] = {}  # 1: on the current path, 2: done

    def visit(i: int, path: list[int]) -> None:
        state[i] = 1
        for j in sorted(after[i]):
            if state.get(j) == 1:
                cycle = " -> ".join(steps[k].model_name for k in [*path[path.index(j) :], j])
                raise InvalidArgumentError(f"ensemble '{name}': its steps form a cycle: {cycle}")
            if j not in state:
                visit(j, [*path, j])
        state[i] = 2

    for i in range(len(steps)):
        if i not in state:
            visit(i, [i])


def _check_decoupled(name: str, steps: Sequence[Step], models: Mapping[str, StepModel], inputs: set[str]) -> None:
    """As Triton: a step may not take inputs that come from different decoupled steps."""
    origin: dict[str, Any] = {t: None for t in inputs}  # tensor -> the decoupled step it streams from
    pending = list(range(len(steps)))
    while pending:
        progressed = False
        for index in list(pending):
            step = steps[index]
            if not all(t in origin for t in step.inputs.values()):
                continue
            sources = {origin[t] for t in step.inputs.values()}
            if len(sources) > 1:  # Triton's rule: one origin per step (the inputs, or one decoupled step)
                raise InvalidArgumentError(
                    f"ensemble '{name}', step {index + 1} ({step.model_name}) takes inputs that come from different "
                    "decoupled steps (or from one and the ensemble's inputs); Triton cannot pair their responses"
                )
            source = index if models[step.model_name].decoupled else next(iter(sources), None)
            for t in step.outputs.values():
                origin[t] = source
            pending.remove(index)
            progressed = True
        if not progressed:
            return  # unreachable after _check_acyclic and the producer checks
