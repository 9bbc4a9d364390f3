"""Config overrides (``embedtriton.config.override``) against the golden model configs.

Each golden file (``tests/unit/golden/<case>.json``, see ``test_triton_json.py``) is the
config Triton gets for a model declared in Python. Read back as an override of that bound
model (as a client's RepositoryModelLoad ``config`` or a ``config.pbtxt`` beside model.py),
it must give back the same ModelConfig, and writing that config again must give the golden
text: parse -> ModelConfig -> write is the identity on every golden config. Changed fields
must come through, and what a bound model cannot change must be refused.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from embedtriton import InstanceGroup, InvalidArgumentError, ModelConfig, SequenceBatcher, VersionPolicy
from embedtriton.config.override import MAX_INSTANCES, parse_override, parse_pbtxt
from embedtriton.config.triton_json import model_config_json

pytest.importorskip("tritonclient.grpc.model_config_pb2")
from google.protobuf import json_format, text_format  # noqa: E402
from test_triton_json import BACKEND, CASES, STRATEGY  # noqa: E402  (the golden cases' declarations)
from tritonclient.grpc import model_config_pb2  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"


def golden(case: str) -> str:
    return (GOLDEN / f"{case}.json").read_text()


def bound(case: str, **changes):
    """(name, inputs, outputs, config) of the model the case declares; ``changes`` to its config."""
    name, inputs, outputs, config = CASES[case]()
    return name, list(inputs), list(outputs), dataclasses.replace(config, **changes) if changes else config


def written(name, inputs, outputs, config) -> dict:
    return json.loads(json.dumps(model_config_json(name, inputs, outputs, config, BACKEND, STRATEGY)))


def what_only_the_application_sets(config: ModelConfig) -> ModelConfig:
    """A bound model with the default config but for what an override cannot carry: the warm-up
    (the application's data) and the batch rule (a Python callable)."""
    return ModelConfig(model_warmup=config.model_warmup, batch_rule=config.batch_rule)


def normalized(config: ModelConfig) -> ModelConfig:
    """No instance_group and one default CPU group are the same config (written the same)."""
    return dataclasses.replace(config, instance_group=config.instance_group or [InstanceGroup()])


def as_pbtxt(json_text: str) -> str:
    return text_format.MessageToString(json_format.Parse(json_text, model_config_pb2.ModelConfig()))


CASE_NAMES = sorted(CASES)


def test_every_golden_file_is_round_tripped():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == CASE_NAMES


@pytest.mark.parametrize("case", CASE_NAMES)
def test_a_golden_config_read_back_and_written_again_is_the_same_text(case):
    name, inputs, outputs, config = bound(case)
    text = golden(case)
    override = parse_override(text, name, inputs, outputs, what_only_the_application_sets(config))
    again = written(name, inputs, outputs, override)
    assert again == json.loads(text)
    assert json.dumps(again, indent=2) + "\n" == text  # the same text, key order included


@pytest.mark.parametrize("case", CASE_NAMES)
def test_a_golden_config_read_back_is_the_declared_model_config(case):
    name, inputs, outputs, config = bound(case)
    override = parse_override(golden(case), name, inputs, outputs, config)
    assert normalized(override) == normalized(config)


WITH_WARMUP = {case for case in CASE_NAMES if "model_warmup" in json.loads(golden(case))}


@pytest.mark.parametrize("case", sorted(set(CASE_NAMES) - WITH_WARMUP))
def test_a_golden_config_as_config_pbtxt_round_trips(case):
    name, inputs, outputs, config = bound(case)
    text = golden(case)
    override = parse_pbtxt(
        as_pbtxt(text), "model/config.pbtxt", name, inputs, outputs, what_only_the_application_sets(config)
    )
    assert written(name, inputs, outputs, override) == json.loads(text)


def test_a_config_pbtxt_cannot_declare_the_warm_up():
    name, inputs, outputs, config = bound("model_warmup")
    with pytest.raises(InvalidArgumentError) as info:
        parse_pbtxt(as_pbtxt(golden("model_warmup")), "m/config.pbtxt", name, inputs, outputs, config)
    assert str(info.value) == (
        "model 'Warm': a config.pbtxt beside model.py cannot declare model_warmup; declare it in "
        "model.py: config = ModelConfig(model_warmup=[...])"
    )


def test_a_config_pbtxt_that_does_not_parse_names_its_file():
    name, inputs, outputs, config = bound("plain_batching_defaults")
    with pytest.raises(InvalidArgumentError, match=r"^m/config\.pbtxt: .*max_batch_sizes"):
        parse_pbtxt("max_batch_sizes: 3", "m/config.pbtxt", name, inputs, outputs, config)


def test_reading_back_is_stable():
    """parse(write(parse(golden))) == parse(golden), for every case."""
    for case in CASE_NAMES:
        name, inputs, outputs, config = bound(case)
        first = parse_override(golden(case), name, inputs, outputs, config)
        second = parse_override(json.dumps(written(name, inputs, outputs, first)), name, inputs, outputs, config)
        assert second == first, case


# -- overrides: a changed field comes through, and only it ---------------------------------------


def override_of(case: str, change) -> tuple[dict, dict]:
    """(the golden config, the config written after applying ``change`` to it as an override)."""
    name, inputs, outputs, config = bound(case)
    original = json.loads(golden(case))
    changed = copy.deepcopy(original)
    change(changed)
    result = parse_override(json.dumps(changed), name, inputs, outputs, what_only_the_application_sets(config))
    return original, written(name, inputs, outputs, result)


def differing(a: dict, b: dict) -> set[str]:
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}


def test_an_override_of_max_batch_size_changes_only_that():
    original, result = override_of("plain_batching_defaults", lambda c: c.update(max_batch_size=2))
    assert differing(original, result) == {"max_batch_size"} and result["max_batch_size"] == 2


def test_an_override_of_the_instances_changes_only_them():
    def more(config):
        config["instance_group"] = [{"count": 3, "kind": "KIND_CPU"}, {"count": 1, "kind": "KIND_GPU", "gpus": [1]}]

    original, result = override_of("preserve_ordering", more)
    assert differing(original, result) == {"instance_group"}
    assert result["instance_group"] == [{"count": 3, "kind": "KIND_CPU"}, {"count": 1, "kind": "KIND_GPU", "gpus": [1]}]


def test_an_override_of_the_dynamic_batcher():
    def slower(config):
        config["dynamic_batching"] = {"max_queue_delay_microseconds": 700, "preferred_batch_size": [2, 4]}

    original, result = override_of("response_cache", slower)
    assert differing(original, result) == {"dynamic_batching"}
    assert result["dynamic_batching"] == {
        "max_queue_delay_microseconds": 700,
        "preferred_batch_size": [2, 4],
        "preserve_ordering": False,
    }


def test_an_override_without_batching_drops_the_batcher_and_the_batch_rule():
    original, result = override_of("batch_rule", lambda c: c.update(max_batch_size=0))
    assert result["max_batch_size"] == 0
    assert "dynamic_batching" not in result and "parameters" not in result  # no rule: no strategy library


def test_an_override_can_cache_responses_or_turn_a_model_decoupled():
    original, result = override_of("plain_batching_defaults", lambda c: c.update(response_cache={"enable": True}))
    assert differing(original, result) == {"response_cache"} and result["response_cache"] == {"enable": True}
    original, result = override_of(
        "plain_batching_defaults", lambda c: c.update(model_transaction_policy={"decoupled": True})
    )
    assert differing(original, result) == {"model_transaction_policy"}
    name, inputs, outputs, _ = bound("decoupled")
    assert (
        result["model_transaction_policy"]
        == written(name, inputs, outputs, ModelConfig(decoupled=True))["model_transaction_policy"]
    )


def test_an_override_can_ask_for_a_sequence_batcher():
    def sequence(config):
        config["sequence_batching"] = {"max_sequence_idle_microseconds": 5_000_000, "oldest": {}}

    _, result = override_of("sequence_direct", sequence)
    expected = written(
        *bound("sequence_direct")[:3],
        ModelConfig(
            max_batch_size=2,
            sequence_batcher=SequenceBatcher(strategy="oldest", max_sequence_idle_microseconds=5_000_000),
        ),
    )
    assert result == expected


def test_what_get_model_config_adds_is_accepted():
    """Triton's applied config carries fields it fills in (optimization, version_policy...)."""

    def as_applied(config):
        config["optimization"] = {"input_pinned_memory": {"enable": True}, "output_pinned_memory": {"enable": True}}
        config["version_policy"] = {"latest": {"num_versions": 1}}

    original, result = override_of("plain_batching_defaults", as_applied)
    assert result == original


def test_an_override_of_the_version_policy():
    name, inputs, outputs, config = bound("plain_batching_defaults")
    text = json.loads(golden("plain_batching_defaults"))
    text["version_policy"] = {"specific": {"versions": [1, 3]}}
    result = parse_override(json.dumps(text), name, inputs, outputs, config)
    assert result.version_policy == VersionPolicy.specific(1, 3)


# -- what a bound model cannot change ------------------------------------------------------------


def refused(case: str, change, **kwargs) -> str:
    name, inputs, outputs, config = bound(case)
    changed = json.loads(golden(case))
    change(changed)
    with pytest.raises(InvalidArgumentError) as info:
        parse_override(json.dumps(changed), name, inputs, outputs, config, **kwargs)
    return str(info.value)


def test_another_models_name_or_backend_is_refused():
    assert refused("decoupled", lambda c: c.update(name="Other")) == (
        "failed to load 'Stream': the config names model 'Other'"
    )
    assert refused("decoupled", lambda c: c.update(backend="python")) == (
        "failed to load 'Stream': a bound model runs on backend 'embedtriton', not 'python'"
    )


def test_other_tensors_are_refused():
    def wider(config):
        config["input"][0]["dims"] = [2]

    assert refused("plain_batching_defaults", wider) == (
        "failed to load 'AddSub': the config's inputs must be the bound ones "
        "[('a', 'TYPE_FP32', (1,)), ('b', 'TYPE_FP32', (1,))]: the callable stays the same"
    )

    def renamed(config):
        config["output"][0]["name"] = "sum"

    assert "the config's outputs must be the bound ones" in refused("plain_batching_defaults", renamed)


def test_fields_a_bound_model_does_not_take_are_refused():
    message = refused("plain_batching_defaults", lambda c: c.update(platform="onnxruntime_onnx"))
    assert message.startswith("failed to load 'AddSub': config fields ['platform'] cannot be set on a bound model")
    assert "misspelt" not in message


def test_a_misspelt_field_or_bad_json_is_not_a_model_config():
    assert refused("plain_batching_defaults", lambda c: c.update(max_batch_sise=2)).startswith(
        "failed to load 'AddSub': the config parameter is not a model config: "
    )
    name, inputs, outputs, config = bound("plain_batching_defaults")
    with pytest.raises(InvalidArgumentError, match="the config parameter is not a model config"):
        parse_override("{not json", name, inputs, outputs, config)


def test_config_parameters_other_than_the_strategy_are_refused():
    def more(config):
        config["parameters"]["EXTRA"] = {"string_value": "1"}

    assert refused("batch_rule", more) == "failed to load 'Ruled': a bound model takes no config parameters"


def test_a_network_client_cannot_ask_for_many_instances_or_change_the_warm_up():
    def many(config):
        config["instance_group"] = [{"count": MAX_INSTANCES + 1, "kind": "KIND_CPU"}]

    assert refused("plain_batching_defaults", many).startswith(
        f"failed to load 'AddSub': {MAX_INSTANCES + 1} model instances asked over the network; at most {MAX_INSTANCES}"
    )

    def fewer_stages(config):
        config["model_warmup"] = config["model_warmup"][:1]

    assert refused("model_warmup", fewer_stages).startswith(
        "failed to load 'Warm': model_warmup cannot be changed over the network"
    )
    # the bound warm-up, sent back as get_model_config returns it, is accepted
    name, inputs, outputs, config = bound("model_warmup")
    assert parse_override(golden("model_warmup"), name, inputs, outputs, config).model_warmup == config.model_warmup


def test_a_config_the_model_config_refuses_is_refused_as_an_override():
    def decoupled_and_cached(config):
        config["model_transaction_policy"] = {"decoupled": True}
        config["response_cache"] = {"enable": True}

    assert "response cache does not serve decoupled models" in refused("plain_batching_defaults", decoupled_and_cached)
