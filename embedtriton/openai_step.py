"""Continuous batching for chat and completion models: the batch-step form of ``bind_chat`` /
``bind_completion`` (``step=fn``; see :mod:`embedtriton.openai` and ``docs/openai.md``).

The model is an iterative sequence model (``SequenceBatcher(iterative=True)``): Triton's sequence
batcher gives every running request (a *sequence*: one choice of one answer) a slot, at most
``max_sequences`` of them, and runs one iteration after another with all of them; a sequence
that ends frees its slot at once and a waiting one joins at the next iteration. Each iteration
calls ``fn`` once with the running :class:`Sequence` objects. What the client asked for is
enforced here, for every transport alike: ``max_tokens`` / ``max_completion_tokens``, ``stop``
strings (never sent, not even in part), the token budget of an iteration (``max_step_tokens``),
and a sequence whose caller left is gone before the next iteration.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .backend.request import Final

_RUN = "embedtriton.openai"  # the key of a sequence's _Run in its request's state


@dataclass(frozen=True)
class Chunk:
    """A piece of a chat or completion answer with what the callable knows about it: yield it
    instead of a ``str`` to report token counts (the totals so far: the last reported wins) or
    why the answer ended (``"stop"``, ``"length"``, ...). Counts not reported are estimated:
    see ``docs/openai.md``."""

    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


JSONObject = dict[str, Any]  # a JSON object as the client sent it


@dataclass(eq=False)
class Sequence:
    """One running answer of a batch-step chat or completion model, as ``fn`` sees it on every
    iteration until it ends.

    ``messages``: the chat messages (None for a completion model); ``prompt``: the completion
    prompt (None for chat); ``params``: the request's other fields (``max_tokens``, ``temperature``,
    ``seed``, ``stop``, ... and extras, as the client sent them); ``state``: a dict kept across
    iterations (the model's KV cache lives there, or is keyed by it), dropped when the sequence
    ends; ``new``: true on its first iteration (the prefill); ``index``: its choice index when
    the client asked for ``n`` > 1 (each choice is a sequence of its own).
    """

    messages: list[JSONObject] | None
    prompt: str | None
    params: JSONObject
    state: dict[str, Any] = field(default_factory=dict)
    new: bool = True
    index: int = 0


Pieces = list[str | Chunk]
StepFunc = Callable[[list[Sequence]], Pieces | Awaitable[Pieces]]  # (async def too)
LeaveFunc = Callable[[Sequence], object]


def prompt_tokens(seq: Sequence) -> int:
    """The prompt's cost in the iteration budget: its words (what the routes' usage estimates)."""
    if seq.prompt is not None:
        return max(1, len(seq.prompt.split()))
    words = 0
    for message in seq.messages or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        words += len(str(content or "").split())
    return max(1, words)


def _held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` could be the start of a stop string."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-k:]):
                longest = k
                break
    return longest


class _Run:
    """What the server keeps of one sequence: its limits, and what it has made and sent."""

    __slots__ = ("seq", "max_tokens", "stops", "made", "held")

    def __init__(self, seq: Sequence) -> None:
        params = seq.params
        limit = params.get("max_completion_tokens", params.get("max_tokens"))
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"max_tokens must be a positive integer, not {limit!r}")
        stop = params.get("stop")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if not all(isinstance(s, str) for s in stops):
            raise ValueError("stop must be a string or a list of strings")
        self.seq = seq
        self.max_tokens: int | None = limit
        self.stops = [s for s in stops if s]
        self.made = 0  # completion tokens so far
        self.held = ""  # text made but not sent: it could be the start of a stop string

    def take(self, piece: Any) -> Any:
        """The outputs to send for this iteration's piece (None: nothing yet), or Final(outputs)."""
        if piece is None:
            piece = ""
        if isinstance(piece, str):
            text, prompt, completion, finish = piece, None, None, None
        elif isinstance(piece, Chunk):
            text, prompt, completion, finish = (
                piece.text,
                piece.prompt_tokens,
                piece.completion_tokens,
                piece.finish_reason,
            )
        else:
            raise TypeError(f"each entry must be a str or a Chunk, not {type(piece).__name__}")
        text = str(text)
        if completion is not None:
            self.made = int(completion)
        elif text:
            self.made += 1
        buffer, self.held = self.held + text, ""
        if self.stops:
            found = [at for at in (buffer.find(s) for s in self.stops) if at >= 0]
            if found:
                buffer, finish = buffer[: min(found)], "stop"
            elif not finish:
                keep = _held_back(buffer, self.stops)
                if keep:
                    buffer, self.held = buffer[:-keep], buffer[-keep:]
        if not finish and self.max_tokens is not None and self.made >= self.max_tokens:
            finish, buffer, self.held = "length", buffer + self.held, ""
        if not buffer and not finish:
            return None
        outputs = {
            "text": np.array([[buffer.encode("utf-8")]], dtype=object),
            "finish_reason": np.array([[(finish or "").encode("utf-8")]], dtype=object),
            "prompt_tokens": np.array([[-1 if prompt is None else int(prompt)]], dtype=np.int64),
            "completion_tokens": np.array([[self.made]], dtype=np.int64),
        }
        return Final(outputs) if finish else outputs


def step_function(
    name: str,
    fn: StepFunc,
    new_sequence: Callable[[Any], Sequence],
    max_step_tokens: int | None,
    on_leave: LeaveFunc | None,
) -> Callable[[list[Any]], list[Any]]:
    """The iterative model's batch-step function around ``fn``."""
    local = threading.local()  # (an async fn's private loop per instance thread, made when first needed)

    def leave(run: _Run) -> None:
        try:
            if on_leave is not None:
                on_leave(run.seq)
        finally:
            run.seq.state.clear()

    def admitted(runs: list[_Run]) -> list[_Run]:
        """The running sequences, and the new ones whose prompts fit this iteration's budget."""
        if max_step_tokens is None:
            return runs
        spent = sum(1 for r in runs if not r.seq.new)
        chosen: list[_Run] = []
        for run in runs:
            if run.seq.new:
                cost = prompt_tokens(run.seq)
                if spent + cost > max_step_tokens and (chosen or spent):
                    continue  # (its prefill waits; one new sequence always goes when nothing runs)
                spent += cost
            chosen.append(run)
        return chosen

    def step(requests: list[Any]) -> list[Any]:
        answers: list[Any] = [None] * len(requests)
        runs: list[_Run] = []
        places: list[int] = []
        for i, request in enumerate(requests):
            run = request.state.get(_RUN)
            if run is None:
                try:
                    run = _Run(new_sequence(request))
                except (ValueError, TypeError, KeyError) as exc:
                    answers[i] = exc  # (this request alone fails)
                    continue
                request.state[_RUN] = run
            runs.append(run)
            places.append(i)
        chosen = admitted(runs)
        if chosen:
            result = fn([run.seq for run in chosen])
            if inspect.isawaitable(result):
                if getattr(local, "loop", None) is None:
                    local.loop = asyncio.new_event_loop()
                result = local.loop.run_until_complete(_awaited(result))
            if not isinstance(result, (list, tuple)) or len(result) != len(chosen):
                raise TypeError(
                    f"model '{name}': the step function must return a list with one str or Chunk per "
                    f"sequence ({len(chosen)}), not {type(result).__name__}"
                    + (f" of {len(result)}" if isinstance(result, (list, tuple)) else "")
                )
            pieces = {id(run): piece for run, piece in zip(chosen, result, strict=True)}
        else:
            pieces = {}
        for run, i in zip(runs, places, strict=True):
            if id(run) not in pieces:
                continue  # (waiting for room in the budget)
            run.seq.new = False
            try:
                answers[i] = run.take(pieces[id(run)])
            except TypeError as exc:
                answers[i] = TypeError(f"model '{name}': {exc}")
            if isinstance(answers[i], (Final, BaseException)):
                leave(run)
        return answers

    def on_forget(request: Any) -> None:
        """Its caller left (or the function failed): the sequence is gone before the next iteration."""
        run = request.state.pop(_RUN, None)
        if run is not None:
            leave(run)

    step.on_forget = on_forget  # type: ignore[attr-defined]
    step.__name__ = getattr(fn, "__name__", "step")
    return step


async def _awaited(result: Awaitable[Any]) -> Any:
    return await result
