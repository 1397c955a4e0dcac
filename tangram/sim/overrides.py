"""``NAME=VALUE`` settings for any field of a parameter dataclass, parsed by the field's type.

``tangram sim --set`` and ``tangram import --set`` use it. Everything is derived from
``dataclasses.fields`` and the type hints (or a function's signature), so a field added to a
parameter dataclass can be set with no change here. Supported types: ``int``, ``float``,
``bool`` (true/false, yes/no, on/off, 1/0), ``str``, ``X | None`` (``none`` or ``null``),
``Literal[...]``, enums (by value or name), ``tuple[X, ...]`` and ``tuple[X, Y]`` (a JSON
array, or comma-separated items), ``list[X]``, ``Sequence[X]`` / ``Iterable[X]`` (as tuples), ``dict[K, V]`` (a JSON object), and nested
dataclasses (a JSON object of their fields, e.g. MOPD's ``teachers`` as a JSON array of
objects, or ``NAME.FIELD=VALUE`` for a single field of a nested dataclass). Any other type is
refused naming it. Every error is an :class:`OverrideError` (a ``ValueError``) naming the setting.
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import difflib
import enum
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Generic origins read as sequences (abstract ones become tuples).
_SEQUENCES = (tuple, list, collections.abc.Sequence, collections.abc.Iterable)

_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})
_NONE = frozenset({"none", "null"})


class OverrideError(ValueError):
    """A setting that cannot be applied: unknown name, malformed text or a refused value."""


@dataclass(frozen=True)
class Setting:
    """One ``NAME=VALUE`` from the command line, as written (``text`` is for messages)."""

    name: str
    value: str
    #: The flag it was given as (``--train-s``), where not ``--set``: messages name it.
    flag: str | None = field(default=None, compare=False)

    @property
    def text(self) -> str:
        return f"{self.name}={self.value}"

    @property
    def where(self) -> str:
        """How it was given, for messages: ``--set NAME=VALUE`` or ``--train-s VALUE`` (an
        old flag's error named a --set the user never gave)."""
        return f"{self.flag} {self.value}" if self.flag else f"--set {self.text}"


def parse_setting(text: str) -> Setting:
    """Split ``NAME=VALUE`` (the value may itself contain ``=``); an argparse type."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise OverrideError(f"expected NAME=VALUE, got {text!r}")
    return Setting(name, value.strip())


def _setting_arg(text: str) -> Setting:
    """argparse type of ``--set NAME=VALUE`` (refused as an argparse error naming the text)."""
    try:
        return parse_setting(text)
    except OverrideError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_set_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set NAME=VALUE``, repeatable, into ``args.settings`` (a list of :class:`Setting`)."""
    parser.add_argument(
        "--set",
        dest="settings",
        metavar="NAME=VALUE",
        type=_setting_arg,
        action="append",
        default=[],
        help=help,
    )


# ---------------------------------------------------------------------------------------------
# Values by type.


def _origin(tp: Any) -> Any:
    return typing.get_origin(tp)


def describe(tp: Any) -> str:
    """A type as a person reads it (``float``, ``tuple[TeacherSpec, ...]``, ``int | None``)."""
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    text = str(tp).replace("typing.", "")
    for module in ("tangram.sim.workloads.", "tangram.sim.", "tangram."):
        while module in text:  # strip dotted module paths, keep the class names
            start = text.index(module)
            end = start + len(module)
            while end < len(text) and (text[end].isalnum() or text[end] in "_."):
                end += 1
            text = text[:start] + text[start:end].rsplit(".", 1)[-1] + text[end:]
    return text


def coerce(tp: Any, value: Any, where: str) -> Any:
    """``value`` (command-line text or a JSON value) as type ``tp``; errors name ``where``."""
    origin = _origin(tp)
    if tp is Any:
        return _json_if_text(value, where) if isinstance(value, str) else value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(tp, value, where)
    if origin is typing.Literal:
        return _coerce_literal(tp, value, where)
    if origin in _SEQUENCES:
        return _coerce_sequence(tp, value, where)
    if origin in (dict, Mapping):
        return _coerce_dict(tp, value, where)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _coerce_dataclass(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _coerce_enum(tp, value, where)
    scalar = _SCALARS.get(tp)
    if scalar is None:
        raise OverrideError(
            f"{where}: cannot be set from the command line (its type is {describe(tp)}; "
            "supported: int, float, bool, str, X | None, Literal, enums, tuples, lists, "
            "sequences, dicts and dataclasses of these)"
        )
    return scalar(value, where)


def _bad(where: str, value: Any, expected: str) -> OverrideError:
    return OverrideError(f"{where}: expected {expected}, got {value!r}")


def _to_int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise _bad(where, value, "an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _bad(where, value, "an integer")


def _to_float(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise _bad(where, value, "a number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            out = float(value.strip())
        except ValueError:
            raise _bad(where, value, "a number") from None
        if math.isnan(out):
            raise _bad(where, value, "a number (not nan)")
        return out
    raise _bad(where, value, "a number")


def _to_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _bad(where, value, "true or false")


def _to_str(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    raise _bad(where, value, "a string")


_SCALARS: dict[Any, Callable[[Any, str], Any]] = {
    int: _to_int,
    float: _to_float,
    bool: _to_bool,
    str: _to_str,
}


def _json_if_text(value: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise OverrideError(f"{where}: not valid JSON ({exc.msg}): {value!r}") from None
    except RecursionError:  # ([[[[... past the parser's recursion: a traceback)
        raise OverrideError(f"{where}: JSON nested too deeply: {value[:40]!r}...") from None


def _coerce_union(tp: Any, value: Any, where: str) -> Any:
    members = typing.get_args(tp)
    if type(None) in members and (
        value is None or (isinstance(value, str) and value.strip().lower() in _NONE)
    ):
        return None
    # str last: text that reads as a number or a bool is one ("2.5" for ``str | float``).
    for member in sorted(members, key=lambda m: m is str):
        if member is type(None):
            continue
        try:
            return coerce(member, value, where)
        except OverrideError:
            continue
    raise _bad(where, value, describe(tp))


def _coerce_literal(tp: Any, value: Any, where: str) -> Any:
    allowed = typing.get_args(tp)
    for option in allowed:
        if value == option or (isinstance(value, str) and str(option) == value.strip()):
            return option
    raise _bad(where, value, f"one of {list(allowed)}")


def _coerce_enum(tp: type[enum.Enum], value: Any, where: str) -> Any:
    for member in tp:
        if value in (member, member.value, member.name):
            return member
    raise _bad(where, value, f"one of {[m.value for m in tp]}")


def _coerce_sequence(tp: Any, value: Any, where: str) -> Any:
    args = typing.get_args(tp)
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            value = _json_if_text(text, where)
        elif text.startswith("{"):
            raise _bad(where, value, f"{describe(tp)}: a JSON array or comma-separated items")
        else:
            value = [item.strip() for item in text.split(",")] if text else []
    if not isinstance(value, list | tuple):
        raise _bad(where, value, f"{describe(tp)} (a JSON array or comma-separated items)")
    fixed = _origin(tp) is tuple and args and not (len(args) == 2 and args[1] is Ellipsis)
    if fixed:
        if len(value) != len(args):
            raise _bad(where, value, f"{len(args)} items ({describe(tp)})")
        return tuple(
            coerce(a, v, f"{where} [item {i}]")
            for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    item = args[0] if args else Any
    items = [coerce(item, v, f"{where} [item {i}]") for i, v in enumerate(value)]
    return items if _origin(tp) is list else tuple(items)


def _coerce_dict(tp: Any, value: Any, where: str) -> dict:
    value = _json_if_text(value, where)
    if not isinstance(value, dict):
        raise _bad(where, value, f"{describe(tp)} (a JSON object)")
    key_type, value_type = typing.get_args(tp) or (Any, Any)
    return {
        coerce(key_type, k, f"{where} [{k}]"): coerce(value_type, v, f"{where} [{k}]")
        for k, v in value.items()
    }


def _coerce_dataclass(tp: type, value: Any, where: str) -> Any:
    value = _json_if_text(value, where)
    if isinstance(value, tp):
        return value
    if not isinstance(value, dict):
        raise _bad(where, value, f"a {tp.__name__} as a JSON object of {field_names(tp)}")
    hints = type_hints(tp)
    known = set(field_names(tp))
    unknown = sorted(set(value) - known)
    if unknown:
        raise OverrideError(
            f"{where}: {tp.__name__} has no field {unknown[0]!r}; fields: {', '.join(field_names(tp))}"
        )
    kwargs = {k: coerce(hints[k], v, f"{where} [{k}]") for k, v in value.items()}
    try:
        return tp(**kwargs)
    except (TypeError, ValueError) as exc:
        raise OverrideError(f"{where}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Applying settings to dataclasses.


def type_hints(tp: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields (their annotations may be strings)."""
    try:
        return typing.get_type_hints(tp)
    except NameError as exc:
        raise OverrideError(f"{tp.__name__}: a field's type cannot be resolved ({exc})") from None


def field_names(tp: type) -> list[str]:
    return [f.name for f in dataclasses.fields(tp) if f.init]


def _unknown(
    name: str, known: Iterable[str], owner: str, where: str, also: str = ""
) -> OverrideError:
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return OverrideError(
        f"{where}: {owner} has no parameter {name!r}{hint}; "
        f"its parameters: {', '.join(known)}{also}"
    )


def assign(
    tp: type,
    path: Sequence[str],
    value: str,
    where: str,
    owner: str,
    current: Any = None,
    also: str = "",
) -> tuple[str, Any]:
    """The (field, value) that sets ``path`` (``a`` or ``a.b.c``) on dataclass ``tp``.

    A dotted path sets one field of a nested dataclass field and keeps its other fields as
    they are in ``current`` (an instance of ``tp``; its defaults when None).
    """
    head, rest = path[0], path[1:]
    if head not in field_names(tp):
        raise _unknown(head, field_names(tp), owner, where, also)
    field_type = type_hints(tp)[head]
    if not rest:
        return head, coerce(field_type, value, where)
    if not (isinstance(field_type, type) and dataclasses.is_dataclass(field_type)):
        raise OverrideError(
            f"{where}: {head!r} is a {describe(field_type)}, not a dataclass with fields"
        )
    inner_current = getattr(current, head) if current is not None else _default(tp, head)
    name, inner = assign(field_type, rest, value, where, f"{owner}.{head}", inner_current)
    return head, _replace(inner_current, {name: inner}, where)


def _default(tp: type, name: str) -> Any:
    for f in dataclasses.fields(tp):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    raise OverrideError(f"{tp.__name__}.{name} has no default to change one field of")


def _replace(obj: Any, changes: Mapping[str, Any], where: str) -> Any:
    try:
        return dataclasses.replace(obj, **changes)
    except (TypeError, ValueError) as exc:
        raise OverrideError(f"{where}: {exc}") from None


def build(
    tp: type, settings: Sequence[Setting], owner: str, prefix: str = "", also: str = ""
) -> Any:
    """``tp()`` with ``settings`` applied in order (a later one wins), validated together.

    When the dataclass refuses the result, its message (which names the field) is given with
    the settings of the fields it names, or with every setting when it names none of them.
    ``also`` ends the message for an unknown name (other things that can be set).
    """
    base = tp()
    changes: dict[str, Any] = {}
    for s in settings:
        where = s.where
        path = s.name[len(prefix) :].split(".")
        if not all(path):
            raise OverrideError(f"{where}: malformed name {s.name!r}")
        so_far = types.SimpleNamespace(
            **{f: changes.get(f, getattr(base, f)) for f in field_names(tp)}
        )
        name, value = assign(tp, path, s.value, where, owner, so_far, also)
        changes[name] = value
    try:
        return dataclasses.replace(base, **changes)
    except (TypeError, ValueError) as exc:
        problem = str(exc)
    # The dataclass's message names the field it refuses: blame the settings of that field.
    blamed = [s for s in settings if s.name[len(prefix) :].split(".")[0] in problem]
    texts = " ".join(s.where for s in blamed or settings)
    raise OverrideError(f"{texts}: {problem}")


def describe_fields(tp: type, prefix: str = "") -> list[dict[str, str]]:
    """Name, type and default of each field ``--set`` can change, for a listing."""
    hints = type_hints(tp)
    out = []
    for f in dataclasses.fields(tp):
        if not f.init:
            continue
        try:
            value = _default(tp, f.name)
            default = value if isinstance(value, str) else repr(value)
        except OverrideError:
            default = "(required)"
        out.append({"name": prefix + f.name, "type": describe(hints[f.name]), "default": default})
    return out


def kwargs_for(
    function: Callable[..., Any], settings: Sequence[Setting], owner: str
) -> dict[str, Any]:
    """Keyword arguments for ``function`` from settings, parsed by its parameters' annotations."""
    signature = inspect.signature(function)
    hints = typing.get_type_hints(function)
    keywords = [
        p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    out: dict[str, Any] = {}
    for s in settings:
        if s.name not in keywords:
            raise _unknown(s.name, keywords, owner, s.where)
        out[s.name] = coerce(hints.get(s.name, Any), s.value, s.where)
    return out
