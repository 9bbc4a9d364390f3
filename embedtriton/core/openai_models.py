"""Which bound models are OpenAI chat, completion or embedding models (``embedtriton.openai``
records them here when it binds them; the HTTP endpoint's ``/v1/`` routes look them up)."""

from __future__ import annotations

import weakref
from typing import Any

CHAT, COMPLETION, EMBEDDING = "chat", "completion", "embedding"

# server -> {model name: kind}
_kinds: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def register(server: Any, name: str, kind: str) -> None:
    """Record that model ``name`` of ``server`` is an OpenAI model of ``kind``."""
    try:
        _kinds.setdefault(server, {})[name] = kind
    except TypeError:  # a server that cannot be weakly referenced: keep it on the object
        server.__dict__.setdefault("_openai_kinds", {})[name] = kind


def kinds(server: Any) -> dict[str, str]:
    """The OpenAI models recorded for ``server``: name -> ``"chat"``, ``"completion"`` or ``"embedding"``."""
    try:
        return dict(_kinds.get(server, {}))
    except TypeError:
        return dict(server.__dict__.get("_openai_kinds", {}))
