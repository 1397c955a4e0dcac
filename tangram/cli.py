"""The ``tangram`` command. Subcommands live in their own modules and register here by name.

Each entry of ``COMMANDS`` maps a subcommand to ``module:function``; the module's
``register(subparsers)`` adds its parser. Modules are imported only when needed, so
``tangram --help`` stays fast and a missing optional dependency (docker, torch) only breaks
the commands that need it.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import importlib
import importlib.util
import os
import select
import sys
from collections.abc import Sequence

#: subcommand -> module that defines ``register(subparsers)``; the parser's ``func`` runs it.
COMMANDS: dict[str, str] = {
    "sim": "tangram.sim.cli",
    "bench": "tangram.bench",
    "profile-cpu": "tangram.exec.aoe.cli",
    "serve": "tangram.exec.service_cli",
    "replay": "tangram.sim.replay_cli",
    "import": "tangram.sim.importers.cli",
    "calibrate": "tangram.exec.eoe.calibrate_cli",
}

#: ``tangram bench NAME`` -> module defining ``register(subparsers)`` for that benchmark.
BENCHMARKS: dict[str, str] = {
    "scheduler": "tangram.bench.scheduler",
    "sim": "tangram.sim.bench",
    "aoe": "tangram.exec.aoe.bench",
    "eoe": "tangram.exec.eoe.bench",
    "service": "tangram.exec.service_bench",
    "soak": "tangram.exec.soak_bench",
    "run-code": "tangram.exec.run_code_bench",
    "ray": "tangram.exec.ray.bench",
    "robustness": "tangram.bench.robustness",
    "online-limit": "tangram.bench.online_limit",
}


def _available(mapping: dict[str, str]) -> dict[str, str]:
    """Entries whose module exists in this checkout (work in progress may not have all)."""
    found = {}
    for name, module in mapping.items():
        try:
            if importlib.util.find_spec(module) is not None:
                found[name] = module
        except ModuleNotFoundError:
            continue
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tangram",
        description="Action-level scheduling of agentic-RL external resources (CPU sandboxes, GPU models, APIs).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _available(COMMANDS).values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _escape_what_the_locale_cannot_encode()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone fails here, in the handler below, not at exit
        return code
    except BrokenPipeError:
        if not _stdout_broken():  # another pipe of the command's (a subprocess, a socket)
            raise
        return _reader_gone()
    except (ValueError, KeyError, FileNotFoundError) as exc:
        # Bad input (a malformed cluster file or trace, an unknown policy or workload): the
        # message names what is wrong; a traceback would only hide it.
        if isinstance(exc, KeyError):
            if not _is_message(exc):
                # A bare key is a lookup gone wrong inside, not a refusal of the input: it
                # printed as "error: 'outcome'", the bug hidden as if the input were bad.
                raise
            message = exc.args[0]
        else:
            message = exc
        print(f"tangram {args.command}: error: {message}", file=sys.stderr)
        return 2


def _is_message(exc: KeyError) -> bool:
    """Whether a KeyError carries a sentence (``unknown CPU node 'x'``), raised to refuse
    the input, rather than the bare key of a failed lookup."""
    return len(exc.args) == 1 and isinstance(exc.args[0], str) and " " in exc.args[0].strip()


def _escape(exc: UnicodeError) -> tuple[str | bytes, int]:
    """A character the stream's encoding lacks: the byte a command-line argument could not
    decode stays that byte (``surrogateescape``), anything else a backslash escape."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start : exc.end]
    if all(0xDC80 <= ord(c) <= 0xDCFF for c in bad):
        return bytes(ord(c) - 0xDC00 for c in bad), exc.end
    return codecs.backslashreplace_errors(exc)


codecs.register_error("tangram-escape", _escape)


def _escape_what_the_locale_cannot_encode() -> None:
    """Under a locale whose encoding is not UTF-8 (``LC_ALL=C`` without UTF-8 mode: ASCII),
    a name the output carries (a cluster's or node's from a cluster file, which is UTF-8) was
    a UnicodeEncodeError ending the command after the run; stdout and stderr write such a
    character as a backslash escape instead, as Python's own stderr does. Under a UTF-8
    locale (or PYTHONIOENCODING=utf-8), whose stdout is strict, a path holding a byte no
    UTF-8 decodes (``--out $'o\\xe9'``: a surrogate escape) failed as "surrogates not
    allowed" when the command printed it, after the run: it is written as that byte."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if encoding.startswith("utf") and stream not in (sys.__stdout__, sys.__stderr__):
            continue  # (a stream put in their place, e.g. a test's capture, is left alone)
        if getattr(stream, "errors", None) not in ("strict", "surrogateescape"):
            continue
        with contextlib.suppress(AttributeError, ValueError, OSError):  # no TextIOWrapper
            stream.reconfigure(errors="tangram-escape")


#: Exit status when stdout's reader went away: what a shell reports for a process SIGPIPE ends.
EXIT_READER_GONE = 141


def _stdout_broken() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write
    end), so that a BrokenPipeError from another pipe of the command is not taken for it."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or a stdout with no descriptor
        return False


def _reader_gone() -> int:
    """Stop quietly once stdout's reader has gone (``tangram sim --json | head``), as Unix
    tools do: the BrokenPipeError was a traceback. Stdout is pointed at /dev/null so that the
    interpreter's flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # a stdout with no file descriptor
        pass
    return EXIT_READER_GONE


if __name__ == "__main__":
    sys.exit(main())
