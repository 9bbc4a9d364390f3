"""Ensemble graphs checked before Triton sees them (``embedtriton.config.ensemble``): every
mistake named in our words; a valid DAG written as Triton's ``ensemble_scheduling``."""

from __future__ import annotations

import numpy as np
import pytest

from embedtriton import DynamicBatcher, InvalidArgumentError, ModelConfig, Step, Tensor
from embedtriton.config.ensemble import StepModel, ensemble_config_json

F32 = np.float32


def t(name: str, shape=(1,), dtype=F32) -> Tensor:
    return Tensor(name=name, dtype=dtype, shape=shape)


MODELS = {
    "Tok": StepModel([t("text", dtype=np.bytes_)], [t("ids", (-1,), np.int64)], 8),
    "Embed": StepModel([t("ids", (-1,), np.int64)], [t("vec", (4,))], 8),
    "Norm": StepModel([t("vec", (4,))], [t("unit", (4,)), t("len")], 8),
    "Mix": StepModel([t("a", (4,)), t("b", (4,))], [t("out", (4,))], 16),
    "Flat": StepModel([t("v", (-1, 4))], [t("w", (-1, 4))], 0),  # no batching: full shapes
    "Small": StepModel([t("vec", (4,))], [t("unit", (4,))], 2),
    "Stream": StepModel([t("vec", (4,))], [t("part", (4,))], 8, decoupled=True),
    "Stream2": StepModel([t("vec", (4,))], [t("part", (4,))], 8, decoupled=True),
}
TEXT, VEC = t("TEXT", dtype=np.bytes_), t("VEC", (4,))
CHAIN = [Step("Tok", {"text": "TEXT"}, {"ids": "ids"}), Step("Embed", {"ids": "ids"}, {"vec": "VEC"})]


def config(steps, inputs=(TEXT,), outputs=(VEC,), cfg=None):
    return ensemble_config_json("P", steps, list(inputs), list(outputs), cfg or ModelConfig(max_batch_size=8), MODELS)


def test_a_chain_is_written_as_tritons_ensemble_scheduling():
    out = config(CHAIN)
    assert out["platform"] == "ensemble" and out["max_batch_size"] == 8 and "backend" not in out
    assert out["input"] == [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}]
    assert out["ensemble_scheduling"]["step"][1] == {
        "model_name": "Embed",
        "model_version": -1,
        "input_map": {"ids": "ids"},
        "output_map": {"vec": "VEC"},
    }


def test_fan_out_fan_in_and_a_model_without_batching():
    steps = [
        *CHAIN[:1],
        Step("Embed", {"ids": "ids"}, {"vec": "v1"}),
        Step("Norm", {"vec": "v1"}, {"unit": "u"}),  # an unmapped output (len) is fine
        Step("Mix", {"a": "v1", "b": "u"}, {"out": "VEC"}),  # fan-in; v1 fans out
    ]
    assert len(config(steps)["ensemble_scheduling"]["step"]) == 4
    flat = [Step("Flat", {"v": "IN"}, {"w": "OUT"})]  # [-1, 4] full shape == batched (4,)
    assert config(flat, [t("IN", (4,))], [t("OUT", (4,))])["max_batch_size"] == 8


@pytest.mark.parametrize(
    "steps, inputs, outputs, message",
    [
        ([Step("Nope", {"x": "TEXT"}, {"y": "VEC"})], (TEXT,), (VEC,), r"step 1 \(Nope\): no model 'Nope' is bound"),
        ([Step("Tok", {"txt": "TEXT"}, {"ids": "VEC"})], (TEXT,), (VEC,), r"'Tok' has no input \['txt'\]"),
        ([Step("Tok", {"text": "TEXT"}, {"idz": "VEC"})], (TEXT,), (VEC,), r"'Tok' has no output \['idz'\]"),
        ([Step("Mix", {"a": "IN"}, {"out": "VEC"})], (t("IN", (4,)),), (VEC,), r"input \['b'\] of 'Mix' is not mapped"),
        (CHAIN, (t("TEXT"),), (VEC,), "ensemble tensor 'TEXT' is FP32 for ensemble input 'TEXT' but BYTES"),
        (CHAIN, (TEXT,), (t("VEC", (5,)),), r"ensemble tensor 'VEC' has shape \[-1, 4\] .* but \[-1, 5\]"),
        ([*CHAIN, Step("Embed", {"ids": "ids"}, {"vec": "VEC"})], (TEXT,), (VEC,), "'VEC' is produced twice"),
        ([Step("Embed", {"ids": "ids"}, {"vec": "TEXT"})], (TEXT, t("ids", (-1,), np.int64)), (VEC,), "produced twice"),
        (CHAIN[:1], (TEXT,), (VEC,), "no step produces its output 'VEC'"),
        (CHAIN, (TEXT, t("EXTRA")), (VEC,), "no step reads its input 'EXTRA'"),
        (
            [Step("Mix", {"a": "IN", "b": "ghost"}, {"out": "VEC"})], (t("IN", (4,)),), (VEC,),
            "step 1 reads 'ghost', which is neither an ensemble input nor any step's output",
        ),
        (
            [Step("Norm", {"vec": "u2"}, {"unit": "u1"}), Step("Mix", {"a": "u1", "b": "IN"}, {"out": "u2"}),
             Step("Embed", {"ids": "IDS"}, {"vec": "VEC"})],
            (t("IN", (4,)), t("IDS", (-1,), np.int64)), (VEC,), "its steps form a cycle: Norm -> Mix -> Norm",
        ),
        ([Step("Small", {"vec": "V"}, {"unit": "VEC"})], (t("V", (4,)),), (VEC,), "takes batches of 8 but 'Small' only 2"),
        ([Step("Stream", {"vec": "V"}, {"part": "VEC"})], (t("V", (4,)),), (VEC,), r"\['Stream'\] is decoupled .*\(decoupled=True\)"),
    ],
)  # fmt: skip
def test_mistakes_are_named_before_triton_sees_them(steps, inputs, outputs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        config(steps, inputs, outputs)


def test_inputs_from_two_decoupled_steps_cannot_be_paired():
    steps = [
        Step("Stream", {"vec": "V"}, {"part": "p1"}),
        Step("Stream2", {"vec": "V"}, {"part": "p2"}),
        Step("Mix", {"a": "p1", "b": "p2"}, {"out": "VEC"}),
    ]
    with pytest.raises(InvalidArgumentError, match=r"step 3 \(Mix\) takes inputs that come from different decoupled"):
        config(steps, [t("V", (4,))], [VEC], ModelConfig(max_batch_size=8, decoupled=True))
    streamed = [Step("Stream", {"vec": "V"}, {"part": "p1"}), Step("Norm", {"vec": "p1"}, {"unit": "VEC"})]
    assert config(streamed, [t("V", (4,))], [VEC], ModelConfig(max_batch_size=8, decoupled=True))


def test_an_ensemble_has_no_batcher_of_its_own():
    with pytest.raises(InvalidArgumentError, match=r"\['batcher'\] belong to the step models"):
        config(CHAIN, cfg=ModelConfig(batcher=DynamicBatcher(max_queue_delay_microseconds=100)))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Step("", {"x": "X"}, {"y": "Y"}), "model_name must be"),
        (lambda: Step("M", {"x": 1}, {"y": "Y"}), "inputs must map the model's tensor names"),
        (lambda: Step("M", {"x": "X"}, {}), "maps no output"),
        (lambda: Step("M", {"x": "X"}, {"y": "Y"}, version=0), "version must be -1"),
    ],
)
def test_step_declarations(make, message):
    with pytest.raises(InvalidArgumentError, match=message):
        make()
