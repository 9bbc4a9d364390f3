"""Golden files for the one writer of Triton's model configuration (``model_config_json``).

Each case below declares a model as a user would (tensors + ModelConfig); its expected JSON is
``tests/unit/golden/<case>.json``, compared exactly (after a JSON round trip, so the writer's
output must also be plain JSON). The golden files were written from the code once and then
checked by hand against Triton's ``model_config.proto``; when a change to the writer is
intended, regenerate them and review the diff before committing::

    EMBEDTRITON_REGEN_GOLDEN=1 pytest tests/unit/test_triton_json.py

With tritonclient installed, every case is also parsed into the real ``inference.ModelConfig``
protobuf message, so a misspelled field or enum value fails here, not at model load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from embedtriton import (
    DynamicBatcher,
    InstanceGroup,
    InvalidArgumentError,
    ModelConfig,
    ModelWarmup,
    QueuePolicy,
    SequenceBatcher,
    Tensor,
    TimeoutAction,
    WarmupInput,
)
from embedtriton.config import name_tensors
from embedtriton.config.triton_json import labels_file_name, model_config_json, warmup_json

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = os.environ.get("EMBEDTRITON_REGEN_GOLDEN") == "1"
BACKEND = "embedtriton"  # the backend name Triton loads our library under (backend.library.BACKEND_NAME)
STRATEGY = "/opt/embedtriton/libembedtriton.so"  # stands for the library path the server passes

F32 = np.float32
AB = (Tensor(name="a", dtype=F32, shape=(1,)), Tensor(name="b", dtype=F32, shape=(1,)))
ADD_SUB = (Tensor(name="add", dtype=F32, shape=(1,)), Tensor(name="sub", dtype=F32, shape=(1,)))
X = (Tensor(name="x", dtype=F32, shape=(1,)),)
TOTAL = (Tensor(name="total", dtype=F32, shape=(1,)),)


def _plain_batching_defaults():
    return "AddSub", AB, ADD_SUB, ModelConfig()


def _dynamic_batcher_priorities():
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=100,
        preferred_batch_size=[2, 4],
        priority_levels=3,
        default_priority_level=2,
        default_queue_policy=QueuePolicy(
            timeout_action=TimeoutAction.DELAY,
            default_timeout_microseconds=500,
            allow_timeout_override=True,
            max_queue_size=7,
        ),
        priority_queue_policy={
            1: QueuePolicy(max_queue_size=3),
            3: QueuePolicy(timeout_action=TimeoutAction.REJECT, default_timeout_microseconds=1000),
        },
    )
    return "Prioritised", AB, ADD_SUB, ModelConfig(max_batch_size=8, batcher=batcher)


def _preserve_ordering():
    batcher = DynamicBatcher(max_queue_delay_microseconds=20000, preserve_ordering=True)
    return "Ordered", AB, ADD_SUB, ModelConfig(max_batch_size=16, batcher=batcher)


def _sequence_direct():
    config = ModelConfig(max_batch_size=2, sequence_batcher=SequenceBatcher())
    return "Acc", X, TOTAL, config


def _sequence_oldest():
    batcher = SequenceBatcher(
        strategy="oldest",
        max_sequence_idle_microseconds=5_000_000,
        max_candidate_sequences=4,
        preferred_batch_size=[2, 4],
        max_queue_delay_microseconds=100,
    )
    return "AccOldest", X, TOTAL, ModelConfig(max_batch_size=4, sequence_batcher=batcher)


def _sequence_iterative_decoupled():
    config = ModelConfig(max_batch_size=4, decoupled=True, sequence_batcher=SequenceBatcher(iterative=True))
    return "Generate", X, TOTAL, config


def _decoupled():
    return "Stream", X, TOTAL, ModelConfig(decoupled=True)


def _instance_groups():
    groups = [InstanceGroup(count=2), InstanceGroup(count=1, kind="GPU", gpus=[0, 1])]
    return "Grouped", AB, ADD_SUB, ModelConfig(max_batch_size=8, instance_group=groups)


def _response_cache():
    return "Cached", AB, ADD_SUB, ModelConfig(max_batch_size=8, response_cache=True)


def _model_warmup():
    inputs = (
        Tensor(name="x", dtype=F32, shape=(3,)),
        Tensor(name="label", dtype=np.bytes_, shape=(1,)),
        Tensor(name="n", dtype=np.int32, shape=(-1,)),
    )
    outputs = (Tensor(name="y", dtype=F32, shape=(3,)),)
    stages = [
        ModelWarmup(
            name="zeros",
            batch_size=1,
            inputs={
                "x": WarmupInput(dtype=F32, shape=(3,), zero_data=True),
                "label": WarmupInput(dtype=np.bytes_, shape=(1,), zero_data=True),
                "n": WarmupInput(dtype=np.int32, shape=(2,), zero_data=True),
            },
        ),
        ModelWarmup(
            name="random",
            batch_size=4,
            count=3,
            inputs={
                "x": WarmupInput(dtype=F32, shape=(3,), random_data=True),
                "label": WarmupInput(dtype=object, shape=(1,), random_data=True),
                "n": WarmupInput(dtype=np.int32, shape=(5,), random_data=True),
            },
        ),
        ModelWarmup(
            name="from-files",
            batch_size=2,
            inputs={
                "x": WarmupInput(dtype=F32, shape=(3,), input_data_file="/data/x.npy"),
                "label": WarmupInput(dtype=np.bytes_, shape=(1,), input_data_file="/data/label.raw"),
                "n": WarmupInput(dtype=np.int32, shape=(1,), zero_data=True),
            },
        ),
    ]
    return "Warm", inputs, outputs, ModelConfig(max_batch_size=4, model_warmup=stages)


def _bytes_tensors():
    inputs = (
        Tensor(name="raw", dtype=np.bytes_, shape=(-1,)),
        Tensor(name="obj", dtype=object, shape=(2, 2)),
        Tensor(name="text", dtype=str, shape=(1,)),
        Tensor(name="bytes", dtype=bytes, shape=(1,)),
    )
    outputs = (Tensor(name="echo", dtype=np.bytes_, shape=(-1,)),)
    return "Echo", inputs, outputs, ModelConfig(max_batch_size=8)


def _every_dtype():
    dtypes = {
        "bool": np.bool_,
        "u8": np.uint8,
        "u16": np.uint16,
        "u32": np.uint32,
        "u64": np.uint64,
        "i8": np.int8,
        "i16": np.int16,
        "i32": np.int32,
        "i64": np.int64,
        "f16": np.float16,
        "f32": np.float32,
        "f64": np.float64,
        "big_endian_f32": np.dtype(">f4"),
    }
    inputs = tuple(Tensor(name=name, dtype=dtype, shape=(1,)) for name, dtype in dtypes.items())
    return "Dtypes", inputs, ADD_SUB, ModelConfig()


def _no_batching():
    inputs = (Tensor(name="image", dtype=np.uint8, shape=(-1, 224, 3)),)
    outputs = (Tensor(name="scores", dtype=F32, shape=(1000,)),)
    stage = ModelWarmup(name="one", batch_size=1, inputs={"image": WarmupInput(np.uint8, (16, 224, 3), zero_data=True)})
    # max_batch_size is ignored without batching: Triton's 0 means "no batch axis"
    return "Classify", inputs, outputs, ModelConfig(batching=False, max_batch_size=64, model_warmup=[stage])


def _batch_rule():
    def same_first_value(candidate, batch):
        return True

    return "Ruled", AB, ADD_SUB, ModelConfig(max_batch_size=8, batch_rule=same_first_value)


def _unnamed_tensors():
    inputs = name_tensors([Tensor(dtype=F32, shape=(1,)), Tensor(dtype=np.bytes_, shape=(1,))], "INPUT")
    outputs = name_tensors([Tensor(dtype=F32, shape=(1,))], "OUTPUT")
    return "Unnamed", inputs, outputs, ModelConfig(max_batch_size=16)


def _input_formats():
    inputs = (
        Tensor(name="photo", dtype=np.uint8, shape=(224, 224, 3), format="NHWC"),
        Tensor(name="planes", dtype=F32, shape=(3, 224, 224), format="FORMAT_NCHW"),
        Tensor(name="meta", dtype=F32, shape=(2,), format="NONE"),
    )
    return "Images", inputs, (Tensor(name="scores", dtype=F32, shape=(10,)),), ModelConfig(max_batch_size=8)


CASES = {
    "plain_batching_defaults": _plain_batching_defaults,
    "dynamic_batcher_priorities": _dynamic_batcher_priorities,
    "preserve_ordering": _preserve_ordering,
    "sequence_direct": _sequence_direct,
    "sequence_oldest": _sequence_oldest,
    "sequence_iterative_decoupled": _sequence_iterative_decoupled,
    "decoupled": _decoupled,
    "instance_groups": _instance_groups,
    "response_cache": _response_cache,
    "model_warmup": _model_warmup,
    "bytes_tensors": _bytes_tensors,
    "every_dtype": _every_dtype,
    "no_batching": _no_batching,
    "batch_rule": _batch_rule,
    "unnamed_tensors": _unnamed_tensors,
    "input_formats": _input_formats,
}


def written(case: str) -> dict:
    """The case's model configuration, through a JSON round trip (as Triton receives it)."""
    name, inputs, outputs, config = CASES[case]()
    return json.loads(json.dumps(model_config_json(name, inputs, outputs, config, BACKEND, STRATEGY)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_model_config_matches_its_golden_file(case):
    path = GOLDEN / f"{case}.json"
    actual = written(case)
    if REGENERATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(actual, indent=2) + "\n")
    with path.open() as f:
        expected = json.load(f)
    assert actual == expected, f"{path.name} differs; if the change is intended: EMBEDTRITON_REGEN_GOLDEN=1"
    # same order too (dicts compare without it): the files stay stable to review
    assert list(actual) == list(expected)


def test_every_golden_file_has_a_case():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_model_config_parses_as_tritons_protobuf(case):
    """Every field name and enum value exists in inference.ModelConfig, and none is lost."""
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    json_format = pytest.importorskip("google.protobuf.json_format")
    actual = written(case)
    message = json_format.ParseDict(actual, model_config_pb2.ModelConfig())  # raises on unknown fields
    assert message.name == actual["name"] and message.backend == "embedtriton"
    assert message.max_batch_size == actual["max_batch_size"]
    assert [i.name for i in message.input] == [i["name"] for i in actual["input"]]
    assert [model_config_pb2.DataType.Name(i.data_type) for i in message.input] == [
        i["data_type"] for i in actual["input"]
    ]
    assert message.WhichOneof("scheduling_choice") == next(
        (k for k in ("dynamic_batching", "sequence_batching") if k in actual), None
    )


# -- the semantics the golden files pin, spelled out ---------------------------------------------


def test_plain_model_defaults():
    config = written("plain_batching_defaults")
    assert config["max_batch_size"] == 4  # PyTriton's default
    assert config["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 0, "preserve_ordering": False}
    assert {"sequence_batching", "parameters", "model_warmup", "response_cache"}.isdisjoint(config)
    assert "model_transaction_policy" not in config


def test_batching_false_writes_max_batch_size_0_and_no_batcher():
    config = written("no_batching")
    assert config["max_batch_size"] == 0
    assert "dynamic_batching" not in config and "sequence_batching" not in config
    assert config["input"] == [{"name": "image", "data_type": "TYPE_UINT8", "dims": [-1, 224, 3]}]


def test_bytes_are_type_string_in_the_model_config():
    config = written("bytes_tensors")
    assert {t["data_type"] for t in config["input"] + config["output"]} == {"TYPE_STRING"}


def test_sequence_controls_are_int32_start_end_ready():
    batching = written("sequence_direct")["sequence_batching"]
    controls = {c["name"]: c["control"] for c in batching["control_input"]}
    assert controls == {
        "_embedtriton_start": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}],
        "_embedtriton_end": [{"kind": "CONTROL_SEQUENCE_END", "int32_false_true": [0, 1]}],
        "_embedtriton_ready": [{"kind": "CONTROL_SEQUENCE_READY", "int32_false_true": [0, 1]}],
    }
    assert batching["direct"] == {} and "oldest" not in batching and "iterative_sequence" not in batching
    assert batching["max_sequence_idle_microseconds"] == 1_000_000


def test_iterative_sequence_is_decoupled():
    config = written("sequence_iterative_decoupled")
    assert config["sequence_batching"]["iterative_sequence"] is True
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert "dynamic_batching" not in config


def test_default_priority_level_0_means_the_lowest():
    """Triton needs default_priority_level in [1, priority_levels]: 0 (unset) becomes the lowest."""
    config = ModelConfig(batcher=DynamicBatcher(priority_levels=5))
    batching = model_config_json("P", AB, ADD_SUB, config, BACKEND)["dynamic_batching"]
    assert batching["priority_levels"] == 5 and batching["default_priority_level"] == 5


def test_priority_queue_policy_keys_are_strings():
    policies = written("dynamic_batcher_priorities")["dynamic_batching"]["priority_queue_policy"]
    assert list(policies) == ["1", "3"]  # protobuf JSON writes map<uint64, ...> keys as strings
    assert policies["3"]["timeout_action"] == "REJECT"
    assert policies["3"]["default_timeout_microseconds"] == 1000


def test_batch_rule_names_the_strategy_library():
    config = written("batch_rule")
    assert config["parameters"] == {"TRITON_BATCH_STRATEGY_PATH": {"string_value": STRATEGY}}
    assert "dynamic_batching" in config


def test_warmup_files_are_named_per_stage_and_input():
    stages = written("model_warmup")["model_warmup"]
    files = stages[2]["inputs"]
    assert files["x"] == {"data_type": "TYPE_FP32", "dims": [3], "input_data_file": "from-files-x.raw"}
    assert files["label"]["input_data_file"] == "from-files-label.raw"  # a file name in <model>/warmup/
    assert stages[1]["count"] == 3 and stages[1]["batch_size"] == 4
    assert stages[1]["inputs"]["label"] == {"data_type": "TYPE_STRING", "dims": [1], "random_data": True}


def test_warmup_file_names_cannot_leave_the_warmup_folder():
    stage = ModelWarmup(name="a/../b", batch_size=1, inputs={"x": WarmupInput(F32, (1,), input_data_file="x.npy")})
    assert warmup_json(stage, X)["inputs"]["x"]["input_data_file"] == "a_.._b-x.raw"


def test_warmup_inputs_must_match_the_model_inputs():
    zero = WarmupInput(F32, (1,), zero_data=True)
    stage = ModelWarmup(name="w", batch_size=1, inputs={"a": zero, "c": zero})
    with pytest.raises(InvalidArgumentError, match=r"missing: \['b'\], unknown: \['c'\]"):
        warmup_json(stage, AB)
    with pytest.raises(InvalidArgumentError, match="ModelWarmup 'w'"):
        model_config_json("M", AB, ADD_SUB, ModelConfig(model_warmup=[stage]), BACKEND)


def test_output_labels_become_a_label_file():
    outputs = [
        Tensor(name="y", dtype=np.float32, shape=(3,)),
        Tensor(name="p", dtype=np.float32, shape=(2,), labels=["a", "b"]),
    ]
    config = model_config_json("M", [Tensor(name="x", dtype=np.float32, shape=(1,))], outputs, ModelConfig(), "b")
    assert "label_filename" not in config["output"][0]
    assert config["output"][1]["label_filename"] == labels_file_name(1) == "labels_1.txt"


@pytest.mark.parametrize("labels", ["cat", ["a", 1], ["two\nlines"]])
def test_labels_must_be_strings_one_per_class(labels):
    with pytest.raises(InvalidArgumentError, match="labels must be a list of strings"):
        Tensor(name="p", dtype=np.float32, shape=(2,), labels=labels)


@pytest.mark.parametrize(
    "config",
    [
        lambda: ModelConfig(max_batch_size=4, batcher=DynamicBatcher(preferred_batch_size=[2, 8])),
        lambda: ModelConfig(max_batch_size=4, batcher=DynamicBatcher(preferred_batch_size=[0])),
        lambda: ModelConfig(
            max_batch_size=2, sequence_batcher=SequenceBatcher(strategy="oldest", preferred_batch_size=[3])
        ),
    ],
)
def test_preferred_batch_sizes_must_fit_max_batch_size(config):
    """Triton refuses these only at load ("preferred size must be <= max batch size")."""
    with pytest.raises(InvalidArgumentError, match="not between 1 and max_batch_size"):
        config()


@pytest.mark.parametrize(
    "spec, message",
    [
        (WarmupInput(np.float64, (1,), zero_data=True), "dtype FP64 but the input is FP32"),
        (WarmupInput(F32, (2,), zero_data=True), r"shape \[2\] does not fit the input's shape \[1\]"),
        (WarmupInput(F32, (1, 1), zero_data=True), r"shape \[1, 1\] does not fit"),
    ],
)
def test_warmup_inputs_must_fit_the_declared_tensors(spec, message):
    """Checked here: a warm-up request Triton refuses fails the load (and crashes Triton 2.51)."""
    stage = ModelWarmup(name="w", batch_size=1, inputs={"a": spec, "b": WarmupInput(F32, (1,), zero_data=True)})
    with pytest.raises(InvalidArgumentError, match=f"ModelWarmup 'w', input 'a': {message}"):
        warmup_json(stage, AB)


def test_warmup_gives_sizes_to_variable_dimensions():
    variable = [Tensor(name="v", dtype=np.float32, shape=(-1, 3))]
    fits = ModelWarmup(name="w", batch_size=1, inputs={"v": WarmupInput(F32, (5, 3), random_data=True)})
    assert warmup_json(fits, variable)["inputs"]["v"]["dims"] == [5, 3]
    unsized = ModelWarmup(name="w", batch_size=1, inputs={"v": WarmupInput(F32, (-1, 3), random_data=True)})
    with pytest.raises(InvalidArgumentError, match="every -1 needs a size"):
        warmup_json(unsized, variable)


def test_batching_off_keeps_an_explicit_batcher_for_its_queue():
    """Without batching Triton's dynamic batcher still queues (priorities, queue policies)."""
    queued = ModelConfig(batching=False, batcher=DynamicBatcher(priority_levels=2))
    config = model_config_json("M", X, X, queued, BACKEND)
    assert config["max_batch_size"] == 0 and config["dynamic_batching"]["priority_levels"] == 2
    assert "dynamic_batching" not in model_config_json("M", X, X, ModelConfig(batching=False), BACKEND)
    with pytest.raises(InvalidArgumentError, match="preferred_batch_size needs batching=True"):
        ModelConfig(batching=False, batcher=DynamicBatcher(preferred_batch_size=[2]))


def test_direct_sequence_batcher_keeps_its_queue_delay():
    config = model_config_json(
        "M", X, X, ModelConfig(sequence_batcher=SequenceBatcher(max_queue_delay_microseconds=250)), BACKEND
    )
    assert config["sequence_batching"]["direct"] == {"max_queue_delay_microseconds": 250}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shape": (3, 224, 224), "format": "NCWH"}, r"format must be 'NHWC' or 'NCHW' .* not 'NCWH'"),
        ({"shape": (224, 224), "format": "NHWC"}, r"format NHWC needs 3 dimensions .*shape=\(224, 224, 3\); got"),
        ({"shape": (1, 3, 224, 224), "format": "nchw"}, r"format NCHW needs 3 dimensions .*shape=\(3, 224, 224\)"),
        ({"shape": (3, 224, 224), "format": 2}, r"format must be 'NHWC' or 'NCHW'"),
    ],
)
def test_an_input_format_is_tritons_and_fits_an_image(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        Tensor(name="image", dtype=F32, **kwargs)


def test_input_formats_are_kept_by_naming_and_refused_on_outputs(add_sub):
    from embedtriton import Server

    (named,) = name_tensors([Tensor(dtype=np.uint8, shape=(8, 8, 3), format="nhwc")], "INPUT")
    assert (named.name, named.format) == ("INPUT_1", "NHWC")
    with pytest.raises(InvalidArgumentError, match=r"output y has format='NCHW'; Triton's formats describe inputs"):
        Server().bind("Out", add_sub, AB, [Tensor(name="y", dtype=F32, shape=(3, 4, 4), format="NCHW")])
