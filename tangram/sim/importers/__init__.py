"""Importers of real agent trajectories into trace format v1, behind one registry.

``IMPORTERS`` maps a source name to ``function(path, **params) -> Trace``. Each importer reads
only the timings its source records and takes everything else (RL step, task, elasticity,
memory, generation time where the file has none) as documented keyword parameters. A file of an
older or foreign schema fails with :class:`TraceImportError` naming the file and what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tangram.sim.importers.base import TraceImportError
from tangram.sim.importers.openhands import import_openhands
from tangram.sim.importers.swe_agent import import_swe_agent
from tangram.trace import Trace

IMPORTERS: dict[str, Callable[..., Trace]] = {
    "swe-agent": import_swe_agent,
    "openhands": import_openhands,
}


def import_trace(source: str, path: str | Path, **params: Any) -> Trace:
    """Import ``path`` with the importer registered as ``source``."""
    try:
        importer = IMPORTERS[source]
    except KeyError:
        raise ValueError(
            f"unknown importer {source!r}; known: {', '.join(sorted(IMPORTERS))}"
        ) from None
    return importer(path, **params)


__all__ = ["IMPORTERS", "TraceImportError", "import_openhands", "import_swe_agent", "import_trace"]
