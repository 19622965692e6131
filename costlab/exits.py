"""How a run ends when its process does: a block's exception decides (`outcome_of`), and a run
the process leaves open (an uncaught exception, a callback never told that training ended) is
closed as the process exits: with the uncaught exception's outcome, else failed."""

from __future__ import annotations

import atexit
import sys
from typing import Any

open_runs: set[Any] = set()  # started, not closed (Run objects)
_uncaught: list[BaseException] = []
_hooked = False


def outcome_of(exc: BaseException | None) -> tuple[str, str]:
    """(status, error) of a run whose block (or process) ended with `exc`."""
    if exc is None:
        return "succeeded", ""
    if isinstance(exc, KeyboardInterrupt):
        return "cancelled", ""
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        return "succeeded", ""
    return "failed", f"{type(exc).__name__}: {exc}"


def watch(run: Any) -> None:
    """Close `run` at exit if nothing else does (its daemon threads still deliver then)."""
    global _hooked
    open_runs.add(run)
    if _hooked:
        return
    _hooked = True
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        _uncaught.append(exc)
        previous(exc_type, exc, tb)

    sys.excepthook = hook
    atexit.register(_close_open_runs)


def _close_open_runs() -> None:
    for run in list(open_runs):
        if _uncaught:
            run.close(*outcome_of(_uncaught[-1]))
        else:
            run.close("failed", "the process exited with the run open (close() was never called)")
