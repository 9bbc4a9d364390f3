"""PyTriton's API on embedtriton: change ``pytriton`` to ``embedtriton.pytriton`` in the imports.

The modules mirror PyTriton 0.7's: ``triton`` (``Triton``, ``TritonConfig``), ``model_config``
(``ModelConfig``, ``Tensor``, ``DynamicBatcher``, ...), ``decorators`` (``batch``, ...),
``client`` (``ModelClient``, ...; needs ``tritonclient``) and ``exceptions``. Submodules load
when first used, so ``import embedtriton.pytriton.triton`` needs no client library.
"""

import importlib
from typing import Any

__all__ = ["client", "decorators", "exceptions", "model_config", "triton"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
