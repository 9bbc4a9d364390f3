"""Custom batching rules: a Python predicate shapes the batches Triton's dynamic batcher forms.

Two rules: cap the total of a "tokens" parameter per batch, and only batch together
requests that ask for the same "adapter".

    python examples/batch_rules.py
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor

seen: dict[str, list[list[dict]]] = {"TokenBudget": [], "PerAdapter": []}


def recorder(name):
    def model(requests):
        seen[name].append([dict(r.parameters) for r in requests])
        return [{"y": r["x"]} for r in requests]

    return model


def token_budget(candidate, batch) -> bool:
    """Admit the candidate while the batch's tokens stay within 16."""
    return sum(r.parameters["tokens"] for r in batch) + candidate.parameters["tokens"] <= 16


def same_adapter(candidate, batch) -> bool:
    """Batch only requests for the same adapter."""
    return not batch or batch[0].parameters["adapter"] == candidate.parameters["adapter"]


def main() -> None:
    server = Server()
    for name, rule in (("TokenBudget", token_budget), ("PerAdapter", same_adapter)):
        server.bind(
            name,
            recorder(name),
            inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))],
            config=ModelConfig(
                max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=10_000), batch_rule=rule
            ),
        )
    with server:
        x = {"x": np.ones((1, 1), np.float32)}
        tokens = [int(t) for t in np.random.default_rng(0).integers(1, 9, 64)]
        with ThreadPoolExecutor(64) as pool:
            list(pool.map(lambda t: server.model("TokenBudget").infer(x, parameters={"tokens": t}), tokens))
            list(
                pool.map(lambda i: server.model("PerAdapter").infer(x, parameters={"adapter": "abc"[i % 3]}), range(64))
            )
        budgets = [sum(p["tokens"] for p in b) for b in seen["TokenBudget"]]
        print(f"TokenBudget: 64 requests in {len(budgets)} batches; tokens per batch: {budgets} (max {max(budgets)})")
        groups = [sorted({p["adapter"] for p in b}) for b in seen["PerAdapter"]]
        print(
            f"PerAdapter: 64 requests in {len(groups)} batches, each of one adapter: {all(len(g) == 1 for g in groups)}"
        )


if __name__ == "__main__":
    main()
