"""A call's one ``CallOutcome``, success or error, built from what the call did; an error keeps
its traceback only as text, so no frame keeps a replica's weights alive.
"""

from __future__ import annotations

import numbers
import time
import traceback
from typing import Any

from tangram.exec.eoe.bookkeeping import CallState
from tangram.exec.eoe.errors import EoeError, shown
from tangram.exec.eoe.records import ERROR, OK, CallOutcome


def call_outcome(
    service: str,
    dop: int | None,
    state: CallState | None,
    value: Any,
    error: EoeError | None,
    start: float,
) -> CallOutcome:
    """The outcome of a call of ``service`` that began at ``start`` (perf_counter seconds);
    ``state`` is None when it failed before it was admitted. A ``service`` that is no
    string (the call was refused for it) is given as its repr: the outcome kept the object
    itself in its str field (a list or dict made the frozen outcome unhashable)."""
    if not isinstance(service, str):
        service = shown(service)
    detail = ""
    if error is not None:
        # The traceback's frames would keep the replica's weights alive (and an evicted
        # replica's memory unfreed) for as long as the outcome lives: keep it as text.
        detail = "".join(traceback.format_exception(error))
        drop_tracebacks(error)
    ok = error is None
    if state is None:
        return CallOutcome(
            service=service,
            status=OK if ok else ERROR,
            value=value,
            error=error,
            dop=as_dop(dop),
            total_s=time.perf_counter() - start,
            detail=detail,
        )
    return CallOutcome(
        service=service,
        status=OK if ok else ERROR,
        value=value,
        error=error,
        gpus=state.cell,
        dop=len(state.cell) if state.cell else as_dop(dop),
        hit=state.hit(ok),
        restored_gpus=tuple(state.restored),
        evicted=tuple(state.evicted),
        queue_s=state.queue_s,
        evict_s=state.evict_s,
        restore_s=state.restore_s,
        exec_s=state.exec_s,
        total_s=time.perf_counter() - start,
        detail=detail,
    )


def as_dop(dop: object) -> int:
    """The outcome's DoP: ``dop`` as an int when it is a whole number (numpy's too), else 0
    (none). A call refused over its dop kept the raw value ('1', 2.0, True, a list) in
    ``CallOutcome.dop``, an int field that the runtime's records read as one."""
    if isinstance(dop, bool) or not isinstance(dop, numbers.Integral):
        return 0
    return int(dop)


def drop_tracebacks(exc: BaseException) -> None:
    """Clear the traceback of ``exc`` and of every exception chained to it."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        stack += [e.__cause__, e.__context__]
