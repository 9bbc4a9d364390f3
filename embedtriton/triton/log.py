"""Triton's log: its settings as the server validates them, and the file it writes (read back
for the reasons Triton gives only there, e.g. why a model failed to load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError
from .options import apply_log_settings

SETTINGS = ("log_info", "log_warning", "log_error", "log_verbose_level", "log_format")


def change_log_settings(current: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``current`` with ``changes`` applied to Triton's (process-wide) logger, each checked."""
    unknown = set(changes) - set(SETTINGS)
    if unknown:
        raise InvalidArgumentError(
            f"unknown log setting(s) {sorted(unknown)}; known: {sorted(SETTINGS)} "
            "(log_file is fixed: the server reads its own log to report load errors)"
        )
    fmt = changes.get("log_format", current["log_format"])
    if fmt not in ("default", "ISO8601"):
        raise InvalidArgumentError(f"log_format must be 'default' or 'ISO8601', not {fmt!r}")
    verbose = changes.get("log_verbose_level", current["log_verbose_level"])
    if not isinstance(verbose, int) or isinstance(verbose, bool) or verbose < 0:
        raise InvalidArgumentError(f"log_verbose_level must be an integer >= 0, not {verbose!r}")
    for flag in ("log_info", "log_warning", "log_error"):
        if not isinstance(changes.get(flag, False), bool):
            raise InvalidArgumentError(f"{flag} must be a bool, not {changes[flag]!r}")
    new = {**current, **changes}
    apply_log_settings(
        new["log_info"], new["log_warning"], new["log_error"], new["log_verbose_level"], new["log_format"] == "ISO8601"
    )
    return new


def log_size(path: Path | None) -> int:
    """How many bytes the log holds (where to start reading what comes next)."""
    try:
        return path.stat().st_size if path else 0
    except OSError:
        return 0


def logged_errors(path: Path | None, offset: int, known: str = "") -> str:
    """The error lines Triton logged since ``offset`` (its load errors say more than its return
    codes), leaving out those whose reason ``known`` (the error returned) already gives."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    found: list[str] = []
    for line in text.splitlines():
        if line.startswith("E") and "CudaDriverHelper" not in line and "modification time" not in line:
            entry = line.split("] ", 1)[-1].strip().strip('"').replace("\\n", "\n").strip()
            if entry not in found and not _told(entry, known):
                found.append(entry)
    return "; ".join(found)


def _told(entry: str, known: str) -> bool:
    """Whether ``known`` already holds the reason of the log ``entry`` (what follows one of its
    'context: ' prefixes, e.g. "failed to load 'm' version 1: Internal: <reason>")."""
    parts = entry.split(": ")
    return any(len(tail) >= 16 and tail in known for tail in (": ".join(parts[i:]) for i in range(len(parts))))
