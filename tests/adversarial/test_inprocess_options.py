"""Wrong per-request options in process: every entry point (``infer``, ``infer_async``,
``infer_many``, ``stream``, ``stream_async`` and ``submit``) refuses them with an
:class:`InvalidArgumentError` that names the option, what it got and what it takes; never with
another exception, and the server keeps serving."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from embedtriton import InvalidArgumentError, ModelConfig, RequestOptions, Server, Tensor, UnsupportedError, batch
from embedtriton.core.request import InferRequest

F32 = np.float32
ONE = np.ones((1, 2), F32)
OPTIONS = sorted(RequestOptions.__annotations__)
ENTRIES = ["infer", "infer_async", "infer_many", "stream", "stream_async", "submit"]
# submit() takes an InferRequest: these options are its fields (correlation_id as its sequence)
SUBMIT_OPTIONS = {"outputs", "request_id", "priority", "timeout_us", "parameters", "correlation_id"}


@batch
def _count(x):
    for i in range(2):
        yield {"y": x + i}


@pytest.fixture(scope="module")
def server():
    server = Server()
    server.bind(
        "AddSub",
        batch(lambda a, b: {"add": a + b, "sub": a - b}),
        [Tensor(name="a", dtype=F32, shape=(-1,)), Tensor(name="b", dtype=F32, shape=(-1,))],
        [Tensor(name="add", dtype=F32, shape=(-1,)), Tensor(name="sub", dtype=F32, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )
    server.bind(
        "Count",
        _count,
        [Tensor(name="x", dtype=F32, shape=(-1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,))],
        ModelConfig(max_batch_size=8, decoupled=True),
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def as_request(inputs, options):
    """The InferRequest that submit() takes, with these options as its fields."""
    cid = options.get("correlation_id")
    sequence = None if "correlation_id" not in options else (cid, 0)
    fields = {k: v for k, v in options.items() if k != "correlation_id"}
    return InferRequest(inputs, sequence=sequence, **fields)


def call(server, loop, entry, options):
    """One call of ``entry`` with ``options``: its outputs (a list of outputs dicts)."""
    add_sub, count = server.model("AddSub"), server.model("Count")
    inputs, stream_inputs = {"a": ONE, "b": ONE}, {"x": ONE}
    if entry == "infer":
        return [add_sub.infer(inputs, **options)]
    if entry == "infer_many":
        return add_sub.infer_many([inputs, inputs], **options)
    if entry == "stream":
        return list(count.stream(stream_inputs, **options))
    if entry == "submit":
        return [add_sub.submit(as_request(inputs, options))]

    async def infer_async():
        try:
            future = add_sub.infer_async(inputs, **options)
        except BaseException as exc:  # its errors are raised where it is awaited
            raise AssertionError(f"infer_async() raised {exc!r} when called, not when awaited") from exc
        return [await future]

    async def stream_async():
        return [part async for part in count.stream_async(stream_inputs, **options)]

    return loop.run_until_complete(infer_async() if entry == "infer_async" else stream_async())


def still_serves(server, loop):
    assert server.model("AddSub").infer({"a": ONE, "b": ONE})["add"][0, 0] == 2
    assert [p["y"][0, 0] for p in server.model("Count").stream({"x": ONE})] == [1, 2]


def refused(server, loop, entry, options) -> str:
    """The message of the InvalidArgumentError that ``entry`` raises for ``options``."""
    with pytest.raises(InvalidArgumentError) as info:
        call(server, loop, entry, options)
    still_serves(server, loop)
    return str(info.value)


# -- the messages --------------------------------------------------------------------------------

PARAMETERS = "parameters must be a mapping of str names to str, int, float or bool values, such as {'k': 1}, not "
PARAMETER = "must be a str, a float, a bool or an int from -2**63 to 2**63-1, not "
PRIORITY = "priority must be an int from 0 to 2**64-1 (1 is the highest level, 0 the model's default), not "
TIMEOUT = "timeout_us must be an int of microseconds from 0 to 2**64-1 (0: no timeout), not "
OUTPUTS = "outputs must be a list of output names (str), not "
CORRELATION = "correlation_id must be an int from 1 to 2**64-1 or a non-empty str, not "
DEVICE = "output_device must be 'cpu', 'gpu' or 'gpu:N', not "
NOT_TEXT = ": a str must be UTF-8 text without NUL characters"

CASES = [
    ({"parameters": 5}, PARAMETERS + "5"),
    ({"parameters": [("k", 1)]}, PARAMETERS + "[('k', 1)]"),
    ({"parameters": "k=1"}, PARAMETERS + "'k=1'"),
    ({"parameters": {"k": {"a": 1}}}, "parameters['k'] " + PARAMETER + "{'a': 1}"),
    ({"parameters": {"k": None}}, "parameters['k'] " + PARAMETER + "None"),
    ({"parameters": {"k": b"x"}}, "parameters['k'] " + PARAMETER + "b'x'"),
    ({"parameters": {"k": 2**63}}, "parameters['k'] " + PARAMETER + "9223372036854775808"),
    ({"parameters": {"k": "a\x00b"}}, "parameters['k'] " + PARAMETER + "'a\\x00b'" + NOT_TEXT),
    ({"parameters": {1: "v"}}, "a name in parameters must be a str, not 1"),
    ({"timeout_us": "1"}, TIMEOUT + "'1'"),
    ({"timeout_us": -1}, TIMEOUT + "-1"),
    ({"timeout_us": 2**64}, TIMEOUT + "18446744073709551616"),
    ({"timeout_us": 1.5}, TIMEOUT + "1.5"),
    ({"timeout_us": math.nan}, TIMEOUT + "nan"),
    ({"timeout_us": False}, TIMEOUT + "False"),
    ({"priority": "1"}, PRIORITY + "'1'"),
    ({"priority": 1.5}, PRIORITY + "1.5"),
    ({"priority": True}, PRIORITY + "True"),
    ({"priority": -1}, PRIORITY + "-1"),
    ({"priority": 2**64}, PRIORITY + "18446744073709551616"),
    ({"priority": math.nan}, PRIORITY + "nan"),
    ({"outputs": "y"}, OUTPUTS + "'y': for one output, pass ['y']"),
    ({"outputs": b"y"}, OUTPUTS + "b'y'"),
    ({"outputs": 5}, OUTPUTS + "5"),
    ({"outputs": [1]}, "outputs[0] must be an output name (str), not 1"),
    ({"outputs": [None]}, "outputs[0] must be an output name (str), not None"),
    ({"request_id": 7}, "request_id must be a str, not 7"),
    ({"request_id": "a\x00b"}, "request_id must be a str, not 'a\\x00b'" + NOT_TEXT),
    ({"request_id": "\ud800"}, "request_id must be a str, not '\\ud800'" + NOT_TEXT),
    ({"correlation_id": True}, CORRELATION + "True"),
    ({"correlation_id": 0}, CORRELATION + "0"),
    ({"correlation_id": -1}, CORRELATION + "-1"),
    ({"correlation_id": 2**64}, CORRELATION + "18446744073709551616"),
    ({"correlation_id": 1.5}, CORRELATION + "1.5"),
    ({"correlation_id": ""}, CORRELATION + "''"),
    ({"correlation_id": "\ud800"}, CORRELATION + "'\\ud800'" + NOT_TEXT),
    ({"correlation_id": 1, "sequence_start": "false"}, "sequence_start must be True or False, not 'false'"),
    ({"correlation_id": 1, "sequence_end": 1}, "sequence_end must be True or False, not 1"),
    ({"output_device": 0}, DEVICE + "0"),
    ({"output_device": None}, DEVICE + "None"),
    ({"output_device": "gpu:\u00b2"}, DEVICE + "'gpu:\u00b2'"),
    ({"output_device": np.array(["cpu", "cpu"])}, DEVICE + "array(['cpu', 'cpu'], dtype='<U3')"),
]


def applies(entry, options) -> bool:
    if entry == "submit":
        return options.keys() <= SUBMIT_OPTIONS
    if entry == "infer_many":  # (refuses any request_id or correlation_id: they are per request)
        return not options.keys() & {"request_id", "correlation_id"}
    return True


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("options, message", CASES, ids=[repr(o)[:40] for o, _ in CASES])
def test_each_wrong_option_names_itself_what_it_got_and_what_it_takes(server, loop, entry, options, message):
    if not applies(entry, options):
        pytest.skip(f"{entry}() does not take {sorted(options)}")
    assert refused(server, loop, entry, options) == message


def test_a_long_or_unprintable_value_is_cut_short(server, loop):
    assert refused(server, loop, "infer", {"priority": "x" * 200}) == PRIORITY + "'" + "x" * 76 + "..."
    assert refused(server, loop, "infer", {"timeout_us": 10**5000}) == TIMEOUT + "<int object>"

    class Unprintable:
        def __repr__(self):
            raise RuntimeError("no")

    assert refused(server, loop, "submit", {"priority": Unprintable()}) == PRIORITY + "<Unprintable object>"
    assert (
        refused(server, loop, "infer", {"request_id": Unprintable()})
        == "request_id must be a str, not <Unprintable object>"
    )


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(
    "options",
    [
        {"priority": 0, "timeout_us": 0, "parameters": {}, "outputs": None, "request_id": None},
        {"priority": np.int64(1), "timeout_us": np.uint64(2**64 - 1)},  # numpy integers are ints
        {"timeout_us": 2**64 - 1, "parameters": {"nan": math.nan, "big": 2**63 - 1, "flag": True}},
        {"correlation_id": 2**64 - 1, "sequence_start": np.True_, "sequence_end": False},
        {"correlation_id": "user-1", "request_id": "r\u00e9q", "output_device": "cpu"},
    ],
    ids=["defaults", "numpy-ints", "edges", "u64-sequence", "str-ids"],
)
def test_right_values_at_the_edges_are_taken(server, loop, entry, options):
    if not applies(entry, options):
        pytest.skip(f"{entry}() does not take {sorted(options)}")
    results = call(server, loop, entry, options)
    assert results and all(isinstance(r, dict) for r in results)


def test_outputs_as_a_tuple_or_any_iterable_of_names(server):
    model = server.model("AddSub")
    assert set(model.infer({"a": ONE, "b": ONE}, outputs=("sub",))) == {"sub"}
    assert set(model.infer({"a": ONE, "b": ONE}, outputs=iter(["add"]))) == {"add"}


# -- fuzzed --------------------------------------------------------------------------------------


class BadIndex:
    def __index__(self):
        raise RuntimeError("no index")


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**66),
    st.floats(),
    st.complex_numbers(),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.array, st.lists(st.integers(-3, 3), max_size=3)),
    st.sampled_from(
        [np.True_, np.array(["cpu", "cpu"]), "add", "y", "cpu", "gpu", "gpu:0", "gpu:x", "", "\ud800", "a\x00b"]
        + [math.nan, math.inf, object(), BadIndex(), b"y", bytearray(b"y")]
    ),
)  # (values without a repr: test_a_long_or_unprintable_value_is_cut_short; hypothesis prints each)
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(), st.none()), inner, max_size=3),
        st.frozensets(st.integers(), max_size=2),
    ),
    max_leaves=6,
)


def answered(server, loop, entry, options) -> None:
    """Outputs, or an InvalidArgumentError naming one of the options; then the server serves."""
    try:
        results = call(server, loop, entry, options)
    except InvalidArgumentError as exc:
        message = str(exc)
        named = [o for o in options if o in message]
        # (a right-typed name of an output the model lacks: Triton's own wording, which names it)
        unknown_output = "outputs" in options and "unexpected inference output" in message
        assert named or unknown_output, f"{entry}(**{options!r}) -> {message!r} names none of the options"
        event(f"refused, naming {'the output' if unknown_output and not named else named[0]}")
    except UnsupportedError as exc:  # output_device='gpu...' where this process sees no such GPU
        assert "output_device" in options and "output_device=" in str(exc), f"{entry}(**{options!r}) -> {exc!r}"
        event("no GPU for output_device")
    else:
        assert results and all(isinstance(r, dict) for r in results)
        event("taken")
    still_serves(server, loop)


fuzzed = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@fuzzed
@given(entry=st.sampled_from(ENTRIES), option=st.sampled_from(OPTIONS), value=anything)
def test_any_value_of_one_option_is_taken_or_refused_by_name(server, loop, entry, option, value):
    assume(entry != "submit" or option in SUBMIT_OPTIONS)
    answered(server, loop, entry, {option: value})


@fuzzed
@given(
    entry=st.sampled_from(ENTRIES),
    options=st.dictionaries(st.sampled_from(OPTIONS), anything, min_size=2, max_size=4),
)
def test_any_values_of_several_options_are_taken_or_refused_by_name(server, loop, entry, options):
    assume(entry != "submit" or options.keys() <= SUBMIT_OPTIONS)
    answered(server, loop, entry, options)
