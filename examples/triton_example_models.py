"""The models Triton's own example clients call, bound as Python callables: a drop-in endpoint.

Triton's client repository (triton-inference-server/client, ``src/python/examples``) ships
scripts written against the models of Triton's ``docs/examples/model_repository`` and a few QA
models. This module binds stand-ins with the same names, tensor names, dtypes, shapes and
answers, so those scripts run unmodified against ``embedtriton serve`` (port 8001 is the one
they default to):

    pip install ".[grpc]" && pip install --no-deps nvidia-pytriton==0.7.0
    embedtriton serve examples.triton_example_models:bind --grpc 127.0.0.1:8001
    python simple_grpc_infer_client.py -u 127.0.0.1:8001     # from Triton's client repository

(or ``cd examples && python -m embedtriton serve triton_example_models:bind``: ``python -m``
at the repository root would import the source tree instead of the installed package.)
``bind_model_repository`` binds only the eight models of ``docs/examples/model_repository``,
the repository that ``simple_grpc_model_control.py`` counts; that script loads and unloads
models, which a server allows its clients only in explicit mode, as tritonserver does:
``embedtriton serve examples.triton_example_models:bind_model_repository --model-control-mode explicit``.

The models, and the scripts that call them:

- ``simple`` (INT32), ``simple_int8`` (INT8), ``simple_string`` (BYTES holding decimal
  integers): INPUT0, INPUT1 [16] -> OUTPUT0 = sum, OUTPUT1 = difference; max_batch_size 8.
  simple_grpc_infer_client, _async_infer_, _aio_infer_, _custom_args_, _keepalive_, _shm_,
  _shm_string_, _string_infer_, _health_metadata, grpc_explicit_{int,int8,byte}_content_client,
  reuse_infer_objects_client; perf_analyzer -m simple (-m simple_string needs --string-data).
- ``simple_identity``: BYTES [-1] identity (simple_grpc_string_infer_client).
- ``simple_sequence``: OUTPUT = INPUT, plus 1 on a sequence's first request (the example
  graphdef adds its START control: the clients send 0, 11, 7, ... and expect 1, 11, 7, ...);
  integer or string correlation ids. ``simple_dyna_sequence``: the same, plus the correlation id
  on the last request (oldest-first sequence batching, two instances).
  ``simple_string_dyna_sequence`` (Triton's QA ``dyna_sequence`` backend): a running sum per
  sequence, plus its decimal string correlation id on the last request.
  simple_grpc_sequence_sync_infer_client, _sequence_stream_, _aio_sequence_stream_ (``-d``
  for the dyna models).
- ``repeat_int32`` (decoupled): one response per element of IN: OUT = IN[i], IDX = i, each
  after DELAY[i] ms (simple_grpc_custom_repeat). The C++ backend also releases the request
  after WAIT ms while it goes on answering; a generator cannot, so WAIT is ignored.
- ``square_int32`` (decoupled): IN = n answers n times with OUT = n (perf_analyzer --streaming).
- ``custom_identity_int32``: INT32 [-1] identity, max_batch_size 1024 (memory_growth_test).
- ``inception_graphdef``, ``densenet_onnx``: the tensors of the image classifiers (grpc_client,
  image_client.py: its input format, NHWC and NCHW, and labels for the top classes), filled by a
  cheap deterministic softmax: shape stand-ins, not classifiers.
"""

from __future__ import annotations

import time

import numpy as np

from embedtriton import InstanceGroup, ModelConfig, SequenceBatcher, Server, Tensor, batch

BATCHED_8 = ModelConfig(max_batch_size=8)


def _sum_and_difference(dtype):
    @batch
    def add_sub(INPUT0, INPUT1):
        return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}

    tensors = [Tensor(name=name, dtype=dtype, shape=(16,)) for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]
    return add_sub, tensors[:2], tensors[2:]


@batch
def string_add_sub(INPUT0, INPUT1):
    """BYTES tensors of decimal integers in, their sum and difference as decimal strings out."""
    a = INPUT0.astype(np.bytes_).astype(np.int64)
    b = INPUT1.astype(np.bytes_).astype(np.int64)
    as_text = np.vectorize(lambda v: str(v).encode(), otypes=[object])
    return {"OUTPUT0": as_text(a + b), "OUTPUT1": as_text(a - b)}


@batch
def identity(INPUT0):
    return {"OUTPUT0": INPUT0}


def _int32(value: int) -> int:
    """``value`` wrapped into INT32's range, as the C++ and TensorFlow models overflow."""
    return (value + 2**31) % 2**32 - 2**31


def start_plus_input(requests):
    """simple_sequence: INPUT + START."""
    return [{"OUTPUT": r["INPUT"] + np.int32(r.sequence_start)} for r in requests]


def dyna_start_plus_input(requests):
    """simple_dyna_sequence: INPUT + START, plus CORRID when END."""
    outputs = []
    for r in requests:
        extra = int(r.sequence_start) + (int(r.correlation_id) if r.sequence_end else 0)
        outputs.append({"OUTPUT": r["INPUT"] + np.int32(_int32(extra))})
    return outputs


def dyna_accumulate(requests):
    """simple_string_dyna_sequence: a running sum per sequence, plus int(CORRID) when END."""
    outputs = []
    for r in requests:
        total = int(r["INPUT"].sum()) + (0 if r.sequence_start else r.state.get("total", 0))
        if r.sequence_end:
            total += int(r.correlation_id)
        r.state["total"] = total = _int32(total)
        outputs.append({"OUTPUT": np.full(r["INPUT"].shape, total, np.int32)})
    return outputs


def repeat(requests):
    """repeat_int32 (decoupled): the i-th response carries IN[i] and IDX i, after DELAY[i] ms."""
    values = [r["IN"] for r in requests]
    delays = [r["DELAY"] for r in requests]
    for i in range(max(len(v) for v in values)):
        wait_ms = max((int(d[i]) for d in delays if len(d) > i), default=0)
        time.sleep(wait_ms / 1000)
        yield [
            {"OUT": np.array([v[i]], np.int32), "IDX": np.array([i], np.uint32)} if len(v) > i else None for v in values
        ]


def square(requests):
    """square_int32 (decoupled): IN = n answers n times with OUT = n."""
    counts = [int(r["IN"][0]) for r in requests]
    for i in range(max(counts, default=0)):
        yield [{"OUT": np.array([n], np.int32)} if n > i else None for n in counts]


def classifier_stand_in(input_name, output_name, classes):
    """A shape-compatible stand-in for an image classifier: a softmax over ``classes``
    classes that depends on the image only through its mean."""

    @batch
    def classify(**inputs):
        images = inputs[input_name]
        means = images.reshape(len(images), -1).mean(axis=1, keepdims=True)
        logits = np.cos(means * np.arange(classes, dtype=np.float32))
        scores = np.exp(logits - logits.max(axis=1, keepdims=True))
        return {output_name: (scores / scores.sum(axis=1, keepdims=True)).astype(np.float32)}

    return classify


def densenet_stand_in(requests):
    """densenet_onnx has no batch axis (max_batch_size 0): one [3, 224, 224] image per request."""
    outputs = []
    for r in requests:
        logits = np.cos(float(r["data_0"].mean()) * np.arange(1000, dtype=np.float32))
        scores = np.exp(logits - logits.max())
        outputs.append({"fc6_1": (scores / scores.sum()).astype(np.float32)})
    return outputs


def _labels(n: int) -> list[str]:
    """Stand-in class names (the real models ship inception_labels.txt / densenet_labels.txt)."""
    return [f"CLASS_{i}" for i in range(n)]


def _sequence_config(strategy, idle_us, instances=1, **oldest):
    return ModelConfig(
        max_batch_size=8,
        sequence_batcher=SequenceBatcher(strategy=strategy, max_sequence_idle_microseconds=idle_us, **oldest),
        instance_group=[InstanceGroup(count=instances)],
    )


def bind_model_repository(server: Server) -> None:
    """The eight models of Triton's docs/examples/model_repository."""
    for name, dtype in (("simple", np.int32), ("simple_int8", np.int8)):
        func, inputs, outputs = _sum_and_difference(dtype)
        server.bind(name, func, inputs, outputs, BATCHED_8)
    server.bind(
        "simple_string",
        string_add_sub,
        [Tensor(name=n, dtype=np.bytes_, shape=(16,)) for n in ("INPUT0", "INPUT1")],
        [Tensor(name=n, dtype=np.bytes_, shape=(16,)) for n in ("OUTPUT0", "OUTPUT1")],
        BATCHED_8,
    )
    server.bind(
        "simple_identity",
        identity,
        [Tensor(name="INPUT0", dtype=np.bytes_, shape=(-1,))],
        [Tensor(name="OUTPUT0", dtype=np.bytes_, shape=(-1,))],
        BATCHED_8,
    )
    sequence_io = (
        [Tensor(name="INPUT", dtype=np.int32, shape=(1,))],
        [Tensor(name="OUTPUT", dtype=np.int32, shape=(1,))],
    )
    server.bind("simple_sequence", start_plus_input, *sequence_io, _sequence_config("direct", 1_000_000))
    server.bind(
        "simple_dyna_sequence",
        dyna_start_plus_input,
        *sequence_io,
        _sequence_config(
            "oldest", 10_000_000, instances=2, max_candidate_sequences=1024, max_queue_delay_microseconds=10_000
        ),
    )
    server.bind(
        "inception_graphdef",
        classifier_stand_in("input", "InceptionV3/Predictions/Softmax", 1001),
        [Tensor(name="input", dtype=np.float32, shape=(299, 299, 3), format="NHWC")],
        [Tensor(name="InceptionV3/Predictions/Softmax", dtype=np.float32, shape=(1001,), labels=_labels(1001))],
        ModelConfig(max_batch_size=128),
    )
    server.bind(
        "densenet_onnx",
        densenet_stand_in,
        [Tensor(name="data_0", dtype=np.float32, shape=(3, 224, 224), format="NCHW")],
        [Tensor(name="fc6_1", dtype=np.float32, shape=(1000,), labels=_labels(1000))],
        ModelConfig(batching=False),
    )


def bind(server: Server) -> None:
    """Every model Triton's Python gRPC example clients call (see the module docstring)."""
    bind_model_repository(server)
    server.bind(
        "simple_string_dyna_sequence",
        dyna_accumulate,
        [Tensor(name="INPUT", dtype=np.int32, shape=(1,))],
        [Tensor(name="OUTPUT", dtype=np.int32, shape=(1,))],
        _sequence_config("oldest", 5_000_000, max_candidate_sequences=6, max_queue_delay_microseconds=0),
    )
    server.bind(
        "repeat_int32",
        repeat,
        [
            Tensor(name="IN", dtype=np.int32, shape=(-1,)),
            Tensor(name="DELAY", dtype=np.uint32, shape=(-1,)),
            Tensor(name="WAIT", dtype=np.uint32, shape=(1,)),
        ],
        [Tensor(name="OUT", dtype=np.int32, shape=(1,)), Tensor(name="IDX", dtype=np.uint32, shape=(1,))],
        ModelConfig(batching=False, decoupled=True),
    )
    server.bind(
        "square_int32",
        square,
        [Tensor(name="IN", dtype=np.int32, shape=(1,))],
        [Tensor(name="OUT", dtype=np.int32, shape=(1,))],
        ModelConfig(batching=False, decoupled=True),
    )
    server.bind(
        "custom_identity_int32",
        identity,
        [Tensor(name="INPUT0", dtype=np.int32, shape=(-1,))],
        [Tensor(name="OUTPUT0", dtype=np.int32, shape=(-1,))],
        ModelConfig(max_batch_size=1024),
    )
