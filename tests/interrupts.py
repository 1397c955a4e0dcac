"""Interrupts injected at every line of a function: the tests that check an executor's books
stay right whatever line a KeyboardInterrupt (or SystemExit) lands on."""

from __future__ import annotations

import dis
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType
from typing import Any


def interruptible_lines(code: CodeType) -> list[int]:
    """The lines of ``code``'s body where an interrupt may land: those starting with an
    instruction other than a NOP (a ``try:`` line; an exception raised there by a trace
    function is covered by no handler, which no real interrupt does)."""
    first: dict[int, str] = {}
    for ins in dis.get_instructions(code):
        line = ins.positions.lineno if ins.positions else None
        if line is not None and line > code.co_firstlineno:
            first.setdefault(line, ins.opname)
    return sorted(line for line, op in first.items() if op != "NOP")


def interrupt_at(code: CodeType, line: int) -> Callable[..., Any]:
    """A trace function raising KeyboardInterrupt once, as ``code`` reaches ``line``."""
    fired: list[bool] = []

    def local(frame: Any, event: str, arg: object) -> Any:
        if event == "line" and frame.f_lineno == line and not fired:
            fired.append(True)
            raise KeyboardInterrupt
        return local

    def trace(frame: Any, event: str, arg: object) -> Any:
        return local if frame.f_code is code else None

    return trace


@contextmanager
def interrupted_at(code: CodeType, line: int) -> Iterator[None]:
    """Run the block with a KeyboardInterrupt raised once as ``code`` reaches ``line``; the
    interrupt, if it reaches the block, is swallowed, and the trace is always removed."""
    sys.settrace(interrupt_at(code, line))
    try:
        yield
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
