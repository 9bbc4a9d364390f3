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


def logged_errors(path: Path | None, offset: int) -> str:
    """The error lines Triton logged since ``offset`` (its load errors say more than its return codes)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    found = []
    for line in text.splitlines():
        if line.startswith("E") and "CudaDriverHelper" not in line and "modification time" not in line:
            found.append(line.split("] ", 1)[-1].strip().strip('"'))
    return "; ".join(found)
