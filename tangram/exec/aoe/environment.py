"""What a client may put in an action's environment and command: the one owner of the rule.

AOE tells an action its grant through variables it sets itself (``TANGRAM_CORES``,
``OMP_NUM_THREADS``, ``TANGRAM_CPUSET``, ``TANGRAM_CPU_QUOTA``, ``TANGRAM_ACTION_ID``); a client
that could set them would lie to the action about its cores, or hide its processes from the
time-out kill. So the ``TANGRAM_`` prefix and ``OMP_NUM_THREADS`` are reserved, a key must be a
shell variable name, and a value a string without NUL. A value and the command must be valid
Unicode (no lone surrogate: the script is sent as UTF-8). The service refuses the rest with a
400 naming the key; AOE checks again before it runs anything.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

#: Variables AOE sets for every action (documented in docs/aoe.md).
RESERVED_NAMES: frozenset[str] = frozenset({"OMP_NUM_THREADS"})
#: Every variable with this prefix is Tangram's.
RESERVED_PREFIX = "TANGRAM_"
#: A POSIX shell variable name.
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: The longest command an action may carry (bytes of UTF-8): longer ones are refused with the
#: limit named, never handed to the runner.
MAX_COMMAND_BYTES = 1 << 20
#: The most variables and the longest value an action's environment may carry.
MAX_ENV_VARS = 256
MAX_ENV_VALUE_BYTES = 64 << 10


def text_problem(what: str, text: str) -> str | None:
    """Why ``text`` cannot be written as UTF-8 (None when it can): a lone surrogate, which a
    JSON escape such as ``"\\ud800"`` decodes to, is no Unicode character; the action's script
    could not be encoded, and it failed after it was accepted."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"{what} is not valid Unicode text: a lone surrogate {text[exc.start]!r} at "
            f"character {exc.start}"
        )
    return None


def is_reserved(key: str) -> bool:
    return key.startswith(RESERVED_PREFIX) or key in RESERVED_NAMES


def env_problem(env: Mapping[Any, Any]) -> str | None:
    """Why ``env`` cannot be an action's environment (None when it can)."""
    if not isinstance(env, Mapping):
        return f"env must be a mapping of strings to strings, got {type(env).__name__}"
    if len(env) > MAX_ENV_VARS:
        return f"env has {len(env)} variables; at most {MAX_ENV_VARS}"
    for key, value in env.items():
        if not isinstance(key, str) or not KEY.match(key):
            return f"env key {key!r} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)"
        if is_reserved(key):
            return (
                f"env key {key!r} is reserved: Tangram sets {RESERVED_PREFIX}* and "
                f"{', '.join(sorted(RESERVED_NAMES))} for every action"
            )
        if not isinstance(value, str):
            return f"env value of {key!r} must be a string, got {type(value).__name__}"
        if "\x00" in value:
            return f"env value of {key!r} contains a NUL byte"
        problem = text_problem(f"env value of {key!r}", value)
        if problem is not None:
            return problem
        if len(value.encode("utf-8", "surrogatepass")) > MAX_ENV_VALUE_BYTES:
            return f"env value of {key!r} is over {MAX_ENV_VALUE_BYTES} bytes"
    return None


#: The most bytes a command and its environment's exports may make together: a script past
#: ``transport.ARGUMENT_MAX_BYTES`` starts as arguments of its shell, and the kernel refuses
#: an exec whose arguments and environment pass ARG_MAX (2 MiB at docker's 8 MiB stack):
#: the action failed with exit 126, "Argument list too long". Room is left for the
#: container's own environment.
MAX_SCRIPT_BYTES = (2 << 20) - (128 << 10)


def command_text(command: str | Sequence[str]) -> str:
    """The shell text of ``command``: a string as given, an argv list quoted, never split."""
    return command if isinstance(command, str) else shlex.join(command)


def exports(env: Mapping[str, str]) -> str:
    """``env`` as the script's leading ``export NAME='value'`` lines (values quoted)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def script_problem(command: str | Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why ``command`` and ``env`` (both already held to the rules above) are too long
    together to start (None when they are not): counted as the script the action runs."""
    size = len((exports(env) + command_text(command)).encode("utf-8", "surrogatepass"))
    if size > MAX_SCRIPT_BYTES:
        return (
            f"command and env make a {size}-byte script; the limit is {MAX_SCRIPT_BYTES} "
            "(put a long program or a large value in a file of the trajectory's container)"
        )
    return None


def command_problem(command: str | tuple[str, ...] | list[str]) -> str | None:
    """Why ``command`` is too long to run, or not text (None when it is neither)."""
    if isinstance(command, str):
        parts = [command]
    elif isinstance(command, list | tuple) and all(isinstance(p, str) for p in command):
        parts = list(command)
    else:
        what = type(command).__name__
        if isinstance(command, list | tuple):
            odd = next(p for p in command if not isinstance(p, str))
            what += f" holding a {type(odd).__name__}"
        return f"command must be a string or a list of strings, got {what}"
    for part in parts:
        problem = text_problem("command", part)
        if problem is not None:
            return problem
        if "\x00" in part:  # the shell drops it and runs another command than the one given
            return f"command contains a NUL byte (at character {part.index(chr(0))})"
    size = sum(len(p.encode("utf-8", "surrogatepass")) + 1 for p in parts)
    if size > MAX_COMMAND_BYTES:
        return (
            f"command is {size} bytes; the limit is {MAX_COMMAND_BYTES} "
            "(put a long program in a file of the trajectory's container and run that)"
        )
    return None
