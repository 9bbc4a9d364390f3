"""Which bound models are OpenAI chat, completion or embedding models (``embedtriton.openai``
records them here when it binds them; the HTTP endpoint's ``/v1/`` routes look them up)."""

from __future__ import annotations

import weakref
from typing import Any

CHAT, COMPLETION, EMBEDDING = "chat", "completion", "embedding"

# server -> {model name: kind}; server -> names of batch-step models (a request parameter "index" names the choice)
_kinds: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()
_steps: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def register(server: Any, name: str, kind: str, step: bool = False) -> None:
    """Record that model ``name`` of ``server`` is an OpenAI model of ``kind`` (``step``: in the
    batch-step form)."""
    try:
        _kinds.setdefault(server, {})[name] = kind
        names = _steps.setdefault(server, set())
    except TypeError:  # a server that cannot be weakly referenced: keep it on the object
        server.__dict__.setdefault("_openai_kinds", {})[name] = kind
        names = server.__dict__.setdefault("_openai_steps", set())
    if step:
        names.add(name)
    else:
        names.discard(name)


def is_step(server: Any, name: str) -> bool:
    """Whether model ``name`` of ``server`` is a batch-step chat or completion model."""
    try:
        return name in _steps.get(server, ())
    except TypeError:
        return name in server.__dict__.get("_openai_steps", ())


def kinds(server: Any) -> dict[str, str]:
    """The OpenAI models recorded for ``server``: name -> ``"chat"``, ``"completion"`` or ``"embedding"``."""
    try:
        return dict(_kinds.get(server, {}))
    except TypeError:
        return dict(server.__dict__.get("_openai_kinds", {}))
