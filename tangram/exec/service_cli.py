"""``tangram serve``: run the live runtime behind its HTTP API until interrupted.

Without ``--cluster`` the cluster is this machine (``discover_cluster``): its cores and
memory, its GPUs (NVML) or two CPU-backed devices, and the demo API endpoints. The service
binds 127.0.0.1 unless told otherwise, and refuses any other address without a token.

The journal (accepted action ids and their outcomes, so a restarted service never runs an id
twice) is at ``--journal PATH``; by default beside the trace (``TRACE.journal``), else in the
state directory (``$XDG_STATE_HOME/tangram``, ``~/.local/state/tangram``) named after the
address and port; with ``--port 0`` and no trace, in a temporary directory removed when the
service stops or its start fails (a service on a random port cannot be found again after a
restart). ``--no-journal``: none.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from tangram.exec.aoe.config import MAX_POOLED
from tangram.exec.service.limits import DEFAULT_MAX_OUTPUT_BYTES, ConnectionLimits
from tangram.report import add_json_flag, int_in, non_negative_int

#: A count of parked containers, bounded as AOE's pool is (``WarmPoolConfig``): refused at the
#: flag, not later as the config field a user never typed.
POOLED = int_in(0, MAX_POOLED, "parked containers, each a Docker container held")
TOKEN_ENV = "TANGRAM_TOKEN"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run the live runtime (AOE, EOE, APIs) behind an HTTP API",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cluster", help="bundled cluster name or TOML path (default: this machine)")
    p.add_argument("--policy", default="tangram", help="scheduling policy (default: tangram)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument(
        "--port", type=port_number, default=8765, help="port (default 8765; 0: any free)"
    )
    p.add_argument(
        "--token",
        default=None,
        help=f"bearer token clients must send (default: ${TOKEN_ENV}); required off loopback",
    )
    p.add_argument(
        "--client",
        action="append",
        default=[],
        metavar="NAME=TOKEN",
        help="a tenant: its token, and trajectory and action ids of its own that no other "
        "client sees (repeat for each; --token is then the operator's, who sees all)",
    )
    p.add_argument(
        "--tenant-max-pending",
        type=int,
        default=None,
        help="the most actions one tenant (--client) may have pending: a flood by one cannot "
        "take every place of --max-pending (default: no per-tenant bound)",
    )
    p.add_argument(
        "--tenant-max-trajectories",
        type=int,
        default=None,
        help="the most trajectories one tenant (--client) may have open: one cannot take the "
        "node's memory with containers (default: no per-tenant bound)",
    )
    p.add_argument(
        "--max-pending",
        type=int,
        default=4096,
        help="admission bound: actions accepted and not yet ended (default 4096)",
    )
    p.add_argument(
        "--default-timeout-s",
        type=float,
        default=600.0,
        help="time limit of actions that give none, queueing included (default 600)",
    )
    p.add_argument(
        "--memory-gb", type=float, default=1.0, help="default container memory (default 1)"
    )
    p.add_argument("--trace", type=Path, help="write the run's trace here at shutdown (JSONL)")
    p.add_argument(
        "--journal",
        type=Path,
        help="journal of accepted ids and outcomes (SQLite; default: beside the trace, else in "
        "the state directory; see above)",
    )
    p.add_argument(
        "--no-journal",
        action="store_true",
        help="no journal: a restarted service forgets every id (a resent one runs again)",
    )
    p.add_argument(
        "--journal-fsync",
        action="store_true",
        help="sync the journal to disk before each start and at every commit (survives a "
        "power loss too; slower)",
    )
    p.add_argument(
        "--max-output-bytes",
        type=int,
        default=DEFAULT_MAX_OUTPUT_BYTES,
        help="the most output per stream a CPU action may ask for, and its default "
        f"(default {DEFAULT_MAX_OUTPUT_BYTES}: 1 MiB)",
    )
    defaults = ConnectionLimits()
    p.add_argument(
        "--header-timeout-s",
        type=float,
        default=defaults.header_timeout_s,
        help="close a connection that has not sent a request's headers within this time of "
        f"opening or of its last answer (idle ones too; default {defaults.header_timeout_s:g})",
    )
    p.add_argument(
        "--body-timeout-s",
        type=float,
        default=defaults.body_timeout_s,
        help="answer 408 and close when a request's body has not arrived within this time "
        f"(default {defaults.body_timeout_s:g})",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=defaults.max_connections,
        help="connections open at once; one more is answered 429 and closed "
        f"(default {defaults.max_connections})",
    )
    p.add_argument(
        "--max-connections-per-client",
        type=int,
        default=None,
        help="connections open at once from one client (peer address), so that one cannot "
        "take all of --max-connections; one more is answered 429 and closed (default: no "
        "bound of its own)",
    )
    p.add_argument(
        "--tenant-max-connections",
        type=int,
        default=None,
        help="connections open at once serving one tenant (--client), from any address, so "
        "that one tenant cannot take all of --max-connections; a request of it on one more is "
        "answered 429 and its connection closed (default: no bound of its own)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on a Ray cluster (an address or 'auto'): the scheduler in a named actor, "
        "an agent per node; the cluster comes from the Ray nodes (docs/ray.md)",
    )
    p.add_argument(
        "--ray-fixed-nodes",
        action="store_true",
        help="with --ray: the cluster is the nodes up at the start (or the cluster file's); "
        "a Ray node that joins under a new name is not used (default: it is added)",
    )
    p.add_argument(
        "--warm-pool",
        type=POOLED,
        default=16,
        metavar="N",
        help="parked containers per image and memory at most, handed to new trajectories and "
        "/run_code requests and reset after use (sized by recent demand; 0: off; default 16)",
    )
    p.add_argument(
        "--warm-pool-total",
        type=POOLED,
        default=32,
        help="parked containers in all (default 32)",
    )
    p.add_argument(
        "--exclusive-cores",
        action="store_true",
        help="grant CPU actions exclusive cores (cpuset + quota) even under a policy whose "
        "grants are CFS weights lending idle cycles (the default policy's): isolation over "
        "work conservation (docs/aoe.md, 'Weighted grants')",
    )
    p.add_argument(
        "--prewarm",
        type=POOLED,
        default=None,
        metavar="N",
        help="/run_code python containers made at start (default 2; 0 with --warm-pool 0)",
    )
    p.add_argument("--no-cpu", action="store_true", help="no CPU executor (no Docker needed)")
    p.add_argument("--no-gpu", action="store_true", help="no GPU executor (no torch needed)")
    p.add_argument(
        "--gpu-backend", default="auto", choices=("auto", "cpu", "cuda"), help="EOE backend"
    )
    p.add_argument(
        "--api",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="forward API endpoint NAME (declared in the cluster) to an HTTP URL; repeatable",
    )
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=KIND[/SHARDS]:PATH",
        help="also serve the Hugging Face model directory PATH as GPU service NAME, KIND "
        "teacher or reward, split by layers over SHARDS GPUs when given (OpenAI-style routes: "
        "/v1/completions, /pooling, /get_reward); repeatable",
    )
    p.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    add_json_flag(p)
    p.set_defaults(func=run)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    port = non_negative_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, got {port}")
    return port


def _setting_pairs(args: argparse.Namespace) -> list[tuple[bool, str]]:
    """The numeric flags out of range, each naming its flag: the settings refused them with
    their own names ("default_memory_gb must be ...", "header_timeout_s ..."), not the flag
    the operator typed. (``not x > 0`` holds for NaN too.)"""
    finite = [("--memory-gb", args.memory_gb), ("--default-timeout-s", args.default_timeout_s)]
    positive = [("--header-timeout-s", args.header_timeout_s)]
    positive.append(("--body-timeout-s", args.body_timeout_s))
    counts = [("--max-pending", args.max_pending), ("--max-connections", args.max_connections)]
    return (
        [
            (not 0 < x < math.inf, f"{flag} must be a positive finite number, got {x!r}")
            for flag, x in finite
        ]
        + [
            (not x > 0, f"{flag} must be a positive number of seconds, got {x!r}")
            for flag, x in positive
        ]
        + [(x < 1, f"{flag} must be at least 1, got {x!r}") for flag, x in counts]
    )


def check_flags(args: argparse.Namespace) -> None:
    """``ValueError`` for flags that contradict each other or could only fail later (at
    the first request or at shutdown): each found at start, naming the flags."""
    pairs = [
        (
            args.no_journal and args.journal_fsync,
            "--journal-fsync needs a journal: drop --no-journal",
        ),
        (args.ray_fixed_nodes and not args.ray, "--ray-fixed-nodes applies only with --ray"),
        # On Ray each node's agent registers the services and runs the executors its node
        # reports (RayConfig.services, the tangram-gpus label): these flags would be dropped.
        (
            bool(args.ray) and bool(args.model),
            "--model is not served with --ray: give the agents RayConfig.services",
        ),
        (
            bool(args.ray) and (args.no_cpu or args.no_gpu),
            "--no-cpu and --no-gpu do not apply with --ray: each node runs what it reports "
            "(its tangram-cores and tangram-gpus labels)",
        ),
        (
            bool(args.ray) and args.gpu_backend != "auto",
            "--gpu-backend does not apply with --ray: each node's tangram-gpus label says it",
        ),
        (args.no_gpu and bool(args.model), "--model serves a GPU service: drop --no-gpu"),
        (
            args.tenant_max_pending is not None and not args.clients,
            "--tenant-max-pending bounds each tenant: give the tenants (--client NAME=TOKEN)",
        ),
        (
            args.tenant_max_pending is not None and args.tenant_max_pending < 1,
            "--tenant-max-pending must be at least 1",
        ),
        (
            args.tenant_max_trajectories is not None and not args.clients,
            "--tenant-max-trajectories bounds each tenant: give the tenants (--client NAME=TOKEN)",
        ),
        (
            args.tenant_max_trajectories is not None and args.tenant_max_trajectories < 1,
            "--tenant-max-trajectories must be at least 1",
        ),
        (
            args.tenant_max_connections is not None and not args.clients,
            "--tenant-max-connections bounds each tenant: give the tenants (--client NAME=TOKEN)",
        ),
        (
            args.tenant_max_connections is not None and args.tenant_max_connections < 1,
            "--tenant-max-connections must be at least 1",
        ),
        (
            args.max_connections_per_client is not None and args.max_connections_per_client < 1,
            "--max-connections-per-client must be at least 1",
        ),
        (
            bool(args.prewarm) and args.warm_pool == 0 and not args.no_cpu,
            "--prewarm parks containers in the warm pool, which --warm-pool 0 turns off "
            "(give --prewarm 0)",
        ),
    ]
    for wrong, why in pairs + _setting_pairs(args):
        if wrong:
            raise ValueError(why)
    if args.prewarm is None:
        args.prewarm = 2 if args.warm_pool > 0 else 0
    if args.trace is not None:
        check_trace_path(args.trace)
    if args.journal is not None and args.journal.is_dir():
        raise ValueError(f"--journal {str(args.journal)!r} is a directory; give a file path")
    from tangram.exec.runtime.config import shared_file

    clash = shared_file(None if args.no_journal else args.journal, args.trace)
    if clash is not None:
        raise ValueError(
            f"--journal {str(args.journal)!r} and --trace {str(args.trace)!r} would share the "
            f"file {str(clash)!r}: each would overwrite the other's; give them different paths"
        )
    if args.gpu_backend == "cuda" and not args.no_gpu:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--gpu-backend cuda: torch sees no CUDA GPU here (try auto or cpu)")


def check_trace_path(path: Path) -> None:
    """The trace is written at shutdown: a path it cannot be written to is refused now,
    not found out when the run's trace is lost."""
    from tangram.trace.errors import TraceError
    from tangram.trace.files import _WRITERS, _suffix

    try:
        _suffix(path, _WRITERS)
    except TraceError as exc:
        raise ValueError(f"--trace: {exc}") from None
    if path.is_dir():
        raise ValueError(f"--trace {str(path)!r} is a directory; give a file path")
    parent = path.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ValueError(f"--trace {str(path)!r}: the directory {str(parent)!r} is not writable")


def clients_of(given: list[str], token: str | None) -> dict[str, str]:
    """``--client NAME=TOKEN`` flags -> {name: token}; ValueError names a repeated name or a
    token used twice (each client must be told apart by its token)."""
    from tangram.exec.service.tenants import Tokens, parse_client

    clients: dict[str, str] = {}
    for arg in given:
        name, secret = parse_client(arg)
        if name in clients:
            raise ValueError(f"--client {name!r} is given twice")
        clients[name] = secret
    Tokens(token, clients)  # checks every token differs
    return clients


def served_services(models: list[str]) -> list[Any]:
    """The example services and each ``--model``'s. A ``--model`` named as an example
    (``reward``, ``teacher``) replaces it: a user's teacher is naturally called "teacher", and
    registered beside the example it failed at start ("service 'teacher' is already
    registered", naming no flag). A name given twice is refused naming ``--model``."""
    from tangram.exec.eoe.hf import service_from_arg
    from tangram.exec.runtime import default_services

    specs = [service_from_arg(m).spec for m in models]
    names = [spec.name for spec in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--model: service name {twice[0]!r} is given twice")
    return [*(s for s in default_services() if s.name not in names), *specs]


def run(args: argparse.Namespace) -> int:
    from tangram.core.cluster_file import load_cluster
    from tangram.exec.runtime import discover_cluster
    from tangram.exec.service.server import check_binding

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    token = args.token or os.environ.get(TOKEN_ENV) or None
    args.clients = clients_of(args.client, token)
    check_binding(args.host, bool(token or args.clients))
    check_flags(args)
    if args.ray:
        from tangram.exec.ray.cli import serve_on_ray

        return serve_on_ray(args, token)
    if args.cluster is not None:  # ('' is refused as empty, not taken as absent)
        cluster = load_cluster(args.cluster)
    else:
        cluster, _ = discover_cluster(gpus=not args.no_gpu, cpu=not args.no_cpu)
    endpoints = api_endpoints(args.api, {a.name for a in cluster.apis})
    # (Everything from the temporary journal's making on runs inside it: a start that fails
    # removes the directory now, not at the interpreter's exit.)
    with contextlib.ExitStack() as scratch:
        return serve_locally(args, token, cluster, endpoints, scratch)


def serve_locally(
    args: argparse.Namespace,
    token: str | None,
    cluster: Any,
    endpoints: dict[str, Any],
    scratch: contextlib.ExitStack,
) -> int:
    """Build the runtime of ``args`` on ``cluster`` and serve it until interrupted; what it
    needs for a while only (a temporary journal) lives as long as ``scratch``."""
    from tangram.exec.runtime import build_runtime
    from tangram.exec.service.server import serve

    config = runtime_config(args, scratch)
    # (Checked before the runtime is built: refused after it, they left its executors running,
    # AOE's warm containers in Docker after the process exited.)
    opts = serve_options(args, token)
    services = served_services(args.model) if args.model else None
    from tangram.exec.aoe import AoeConfig
    from tangram.exec.aoe.config import WarmPoolConfig

    pool = WarmPoolConfig(max_per_key=args.warm_pool, max_total=args.warm_pool_total)
    runtime = build_runtime(
        cluster,
        config,
        aoe_config=AoeConfig(warm_pool=pool),
        cpu=not args.no_cpu,
        gpu=not args.no_gpu,
        gpu_backend=args.gpu_backend,
        services=services,
        endpoints=endpoints,
    )
    try:
        prepare(runtime, config, args)
    except BaseException:
        # (The runtime never started: its close stops the executors build_runtime made,
        # which were left running, AOE's warm containers with them.)
        asyncio.run(runtime.close(grace_s=0.0))
        raise

    def ready(url: str) -> None:
        info = {
            "url": url,
            "policy": args.policy,
            "cluster": cluster.name,
            "cpu": runtime.cpu.node.name if runtime.cpu else None,
            "gpu": runtime.gpu.node.name if runtime.gpu else None,
            "api": list(runtime.api.endpoints()),
            "token": bool(token),
            "tenants": sorted(args.clients),
            "journal": str(config.journal_path) if config.journal_path else None,
        }
        if args.json:
            print(json.dumps(info), flush=True)
        else:
            print(f"tangram serve: listening on {url} ({json.dumps(info)})", flush=True)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(runtime, opts, ready))
    except OSError as exc:  # the address: in use, not this machine's, not resolvable
        raise ValueError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    print("tangram serve: stopped", file=sys.stderr)
    return 0


def serve_options(args: argparse.Namespace, token: str | None) -> Any:
    """The ``ServeOptions`` of ``tangram serve``'s flags (``ValueError`` naming a bad one)."""
    from tangram.exec.service.server import ServeOptions

    limits = ConnectionLimits(
        header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        tenant_max_connections=args.tenant_max_connections,
    )
    return ServeOptions(
        host=args.host,
        port=args.port,
        token=token,
        clients=args.clients,
        tenant_max_pending=args.tenant_max_pending,
        tenant_max_trajectories=args.tenant_max_trajectories,
        trace_path=args.trace,
        max_output_bytes=args.max_output_bytes,
        limits=limits,
    )


def prepare(runtime: Any, config: Any, args: argparse.Namespace) -> None:
    """What ``tangram serve`` checks and does once its runtime is built: ``--memory-gb``
    within the CPU node, then ``--prewarm``'s warm containers."""
    from tangram.exec.service.sandbox_fusion import RunCodeSettings

    if runtime.cpu is not None and config.default_memory_gb > runtime.cpu.node.memory_gb:
        raise ValueError(
            f"--memory-gb {args.memory_gb:g}: more than the CPU node {runtime.cpu.node.name!r} "
            f"has for containers ({runtime.cpu.node.memory_gb:g} GB): no trajectory could open"
        )
    if runtime.cpu is not None and args.prewarm > 0:
        rc = RunCodeSettings()
        runtime.cpu.aoe.prewarm(args.prewarm, image=rc.image, memory_gb=rc.memory_gb)


def api_endpoints(items: list[str], declared: set[str] | None = None) -> dict[str, Any]:
    """``--api NAME=URL`` options -> endpoint callables forwarding to those URLs; NAME must
    be an endpoint the cluster declares (when ``declared`` is given), once."""
    from tangram.exec.runtime import http_endpoint

    endpoints = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"--api {item!r}: expected NAME=http(s)://...")
        if name in endpoints:
            raise ValueError(f"--api {name!r} is given twice")
        _check_url(name, url)
        if declared is not None and name not in declared:
            raise ValueError(
                f"--api {item!r}: the cluster declares no API endpoint {name!r} "
                f"(declared: {sorted(declared)})"
            )
        endpoints[name] = http_endpoint(url)
    return endpoints


def _check_url(name: str, url: str) -> None:
    """``ValueError`` naming ``--api NAME`` when httpx cannot use its URL (a bad port, host or
    character): accepted, every call of the endpoint failed, and only as 'the URL could not
    be used', since its message, which may quote the URL's secrets, goes to clients."""
    import httpx
    import idna

    try:
        host = httpx.Request("POST", url).url.host  # (as HttpEndpoint's call makes it)
    except (httpx.InvalidURL, idna.IDNAError) as exc:
        raise ValueError(f"--api {name}: its URL cannot be used: {exc}") from None
    if not host:
        raise ValueError(f"--api {name}: its URL has no host")


def runtime_config(args: argparse.Namespace, scratch: contextlib.ExitStack) -> Any:
    """The ``RuntimeConfig`` of ``tangram serve``'s options (a temporary journal, when one is
    needed, lives as long as ``scratch``)."""
    from tangram.exec.runtime import RuntimeConfig

    if args.no_journal and args.journal is not None:
        raise ValueError("give --journal PATH or --no-journal, not both")
    return RuntimeConfig(
        policy=args.policy,
        max_pending=args.max_pending,
        default_timeout_s=args.default_timeout_s,
        default_memory_gb=args.memory_gb,
        trace_path=args.trace,
        journal_path=None if args.no_journal else journal_path(args, scratch),
        journal_fsync=args.journal_fsync,
        exclusive_cores=args.exclusive_cores,
    )


def journal_path(args: argparse.Namespace, scratch: contextlib.ExitStack) -> Path:
    """The journal's path: given; beside the trace; in the state directory, named after the
    address and port (a restart on them finds it); or, on a random port without a trace, in
    a temporary directory that ``scratch`` removes."""
    if args.journal is not None:
        return args.journal
    if args.trace is not None:
        return args.trace.with_name(args.trace.name + ".journal")
    if args.port == 0:
        tmp = scratch.enter_context(tempfile.TemporaryDirectory(prefix="tangram-journal-"))
        return Path(tmp) / "journal.sqlite"
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    name = "".join(c if c.isalnum() or c in ".-" else "_" for c in args.host)
    return state / "tangram" / f"journal-{name}-{args.port}.sqlite"
