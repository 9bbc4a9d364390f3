"""A three-step pipeline, preprocess -> model -> postprocess, composed two ways:

- as an **ensemble** (``server.bind_ensemble``): Triton's ensemble scheduler runs the steps,
  one call for the whole pipeline, each step batched by its own batcher;
- as **BLS** (model-to-model calls): a callable that calls the step models itself with
  ``server.model(...).infer``, so it can branch and loop.

Prints both results (the same) and each step's statistics.

    python examples/pipeline.py
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from embedtriton import ModelConfig, Server, Step, Tensor, batch

server = Server()


@batch
def preprocess(text: np.ndarray) -> dict[str, np.ndarray]:
    """Bytes -> a fixed-size feature vector (character codes, scaled)."""
    rows = [np.frombuffer(t[0].ljust(8)[:8], np.uint8) for t in text]
    return {"features": np.stack(rows).astype(np.float32) / 255.0}


@batch
def model(features: np.ndarray) -> dict[str, np.ndarray]:
    """A 'model': a fixed linear layer with 3 classes."""
    weights = np.random.default_rng(7).normal(size=(8, 3)).astype(np.float32) * 4
    return {"logits": features @ weights}


@batch
def postprocess(logits: np.ndarray) -> dict[str, np.ndarray]:
    """Logits -> the winning class and its softmax probability."""
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = exp / exp.sum(axis=1, keepdims=True)
    return {"label": probs.argmax(axis=1).astype(np.int64)[:, None], "score": probs.max(axis=1)[:, None]}


@batch
def pipeline_bls(text: np.ndarray) -> dict[str, np.ndarray]:
    """The same pipeline as one callable calling the three models (each batches with other traffic)."""
    features = server.model("Preprocess").infer({"text": text})["features"]
    logits = server.model("Model").infer({"features": features})["logits"]
    return server.model("Postprocess").infer({"logits": logits})


TEXT = Tensor(name="text", dtype=np.bytes_, shape=(1,))
LABEL, SCORE = Tensor(name="label", dtype=np.int64, shape=(1,)), Tensor(name="score", dtype=np.float32, shape=(1,))


def main() -> None:
    batched = ModelConfig(max_batch_size=16)
    server.bind("Preprocess", preprocess, [TEXT], [Tensor(name="features", dtype=np.float32, shape=(8,))], batched)
    server.bind(
        "Model",
        model,
        [Tensor(name="features", dtype=np.float32, shape=(8,))],
        [Tensor(name="logits", dtype=np.float32, shape=(3,))],
        batched,
    )
    server.bind(
        "Postprocess", postprocess, [Tensor(name="logits", dtype=np.float32, shape=(3,))], [LABEL, SCORE], batched
    )
    server.bind_ensemble(
        "PipelineEnsemble",
        steps=[
            Step("Preprocess", inputs={"text": "text"}, outputs={"features": "features"}),
            Step("Model", inputs={"features": "features"}, outputs={"logits": "logits"}),
            Step("Postprocess", inputs={"logits": "logits"}, outputs={"label": "label", "score": "score"}),
        ],
        inputs=[TEXT],
        outputs=[LABEL, SCORE],
        config=batched,
    )
    server.bind("PipelineBLS", pipeline_bls, [TEXT], [LABEL, SCORE], batched)
    with server:
        words = np.array([[b"triton"], [b"in"], [b"process"]], dtype=np.object_)
        for name in ("PipelineEnsemble", "PipelineBLS"):
            out = server.model(name).infer({"text": words})
            pairs = ", ".join(
                f"{w[0].decode()}->{int(c)} ({s:.3f})"
                for w, c, s in zip(words, out["label"][:, 0], out["score"][:, 0], strict=True)
            )
            print(f"{name}: {pairs}")

        # 64 concurrent callers of each: the steps batch across callers
        with ThreadPoolExecutor(64) as pool:
            for name in ("PipelineEnsemble", "PipelineBLS"):
                list(pool.map(lambda i, n=name: server.model(n).infer({"text": words[i % 3 : i % 3 + 1]}), range(256)))
        for step in ("Preprocess", "Model", "Postprocess", "PipelineEnsemble", "PipelineBLS"):
            stats = server.model(step).statistics()
            print(f"{step:>16}: {stats['inference_count']:4d} requests in {stats['execution_count']:4d} executions")


if __name__ == "__main__":
    main()
