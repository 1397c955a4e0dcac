"""Clients as tenants: each tenant's token names it, and its trajectory and action ids live in
a namespace of its own (``NAME:id`` inside the runtime).

Why a namespace and not only an owner check: RL workers number their trajectories from 0, so
two tenants sharing one service would ask for the same ids; with one id space the second
would be refused (or, worse, one could close the other's trajectory). With a namespace each
tenant sees only its own trajectories and actions, may reuse the others' ids, and a request
naming another tenant's id finds nothing (404, as an id never used). The operator's token
(``--token``) keeps the whole view: its ids are the runtime's own, tenants' ones included
with their prefix, and it alone reads the trace (which holds every tenant's actions).
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.records import MAX_ID_CHARS

#: A tenant's name: short, and without the separator, so ``NAME:id`` splits at its first ':'.
NAME = re.compile(r"[A-Za-z0-9_.-]{1,32}")
SEPARATOR = ":"


@dataclass(frozen=True)
class Tenant:
    """One client's namespace: its ids, as it names them, map to ``name:id`` and back."""

    name: str

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(
                f"tenant name {self.name!r}: 1 to 32 characters of A-Z a-z 0-9 _ . - (a ':' "
                "would make its ids ambiguous)"
            )

    @property
    def prefix(self) -> str:
        return self.name + SEPARATOR

    @property
    def max_id_chars(self) -> int:
        """The longest id the tenant may use: the runtime's limit less its prefix."""
        return MAX_ID_CHARS - len(self.prefix)

    def inner(self, field: str, value: str) -> str:
        """The runtime's id for the tenant's ``value`` (already checked against the id
        alphabet); a 400 naming ``field`` when the prefix would make it too long."""
        if len(value) > self.max_id_chars:
            raise BadRequest(
                f"{field} must be at most {self.max_id_chars} characters for tenant "
                f"{self.name!r} (its ids are kept as {self.prefix}<id>), got {len(value)}"
            )
        return self.prefix + value

    def fresh(self, kind: str) -> str:
        """A new runtime id in the namespace, for a request that named none (``t`` or ``a``)."""
        return f"{self.prefix}{kind}-{uuid.uuid4().hex[:12]}"

    def owns(self, inner_id: str | None) -> bool:
        return inner_id is not None and inner_id.startswith(self.prefix)

    def outer(self, inner_id: str | None) -> str | None:
        """The tenant's name for one of its runtime ids (other ids pass unchanged)."""
        if inner_id is not None and inner_id.startswith(self.prefix):
            return inner_id[len(self.prefix) :]
        return inner_id

    def clean(self, message: str) -> str:
        """An error message as the tenant should read it: its own ids without the prefix."""
        for quote in ("'", '"'):
            message = message.replace(quote + self.prefix, quote)
        return message


def parse_client(arg: str) -> tuple[str, str]:
    """``NAME=TOKEN`` (the CLI's ``--client``) -> (name, token); ValueError says what is wrong."""
    name, sep, token = arg.partition("=")
    if not sep or not token:
        raise ValueError(f"--client {arg!r}: expected NAME=TOKEN")
    Tenant(name)  # checks the name
    return name, token


class Tokens:
    """Which client a bearer token is: the operator (``token``) or a tenant (``clients``:
    name -> token). Every token must differ from every other (else a request could not say
    whose it is)."""

    def __init__(self, token: str | None, clients: Mapping[str, str] | None = None) -> None:
        pairs: list[tuple[bytes, Tenant | None]] = []
        if token is not None:
            pairs.append((_raw(token), None))
        for name, secret in (clients or {}).items():
            if not secret:
                raise ValueError(f"tenant {name!r} has an empty token")
            pairs.append((_raw(secret), Tenant(name)))
        seen: set[bytes] = set()
        for raw, _ in pairs:
            if raw in seen:
                raise ValueError("two clients were given the same token: each needs its own")
            seen.add(raw)
        self.pairs = pairs

    @property
    def required(self) -> bool:
        return bool(self.pairs)

    @property
    def names(self) -> Iterable[str]:
        return [t.name for _, t in self.pairs if t is not None]

    def match(self, given: str) -> tuple[bool, Tenant | None]:
        """(known, tenant): tenant None for the operator. Every token is compared, in
        constant time each, so the time taken does not say which one came close."""
        raw = _raw(given)
        found: tuple[bool, Tenant | None] = (False, None)
        for secret, tenant in self.pairs:
            if secrets.compare_digest(raw, secret):
                found = (True, tenant)
        return found


def _raw(token: str) -> bytes:
    # Header bytes that are not UTF-8 arrive as surrogates: compare the bytes as sent.
    return token.encode("utf-8", "surrogateescape")
