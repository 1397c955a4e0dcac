"""``tangram serve --ray ADDRESS|auto``: the HTTP service on a Ray cluster.

Attaches to the cluster (``ray.init(address=...)``), starts the scheduler actor on this
node (agents on every node; ``docs/ray.md``) with the settings of ``tangram serve`` (policy,
bounds, trace, journal, token, limits), prints where it listens, and on SIGINT/SIGTERM shuts
it down: queued actions end, running ones finish, containers are removed, the actor goes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading

#: The Ray namespace of ``tangram serve --ray``'s scheduler actor (``RayConfig.namespace``).
NAMESPACE = "tangram"


def serve_on_ray(args: argparse.Namespace, token: str | None) -> int:
    import ray

    from tangram.core.cluster_file import load_cluster
    from tangram.exec.aoe.config import WarmPoolConfig
    from tangram.exec.ray.config import RayConfig
    from tangram.exec.ray.service import start, stop
    from tangram.exec.runtime.discovery import default_apis
    from tangram.exec.service.limits import ConnectionLimits
    from tangram.exec.service.server import ServeOptions
    from tangram.exec.service_cli import api_endpoints, runtime_config

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    # A cluster file maps Ray nodes (by their tangram-name label) to its nodes; without one
    # the cluster is the Ray nodes alive at the start.
    cluster = load_cluster(args.cluster) if args.cluster is not None else None
    apis = cluster.apis if cluster is not None else default_apis()
    # (Checked against the cluster's endpoints, as without --ray: an undeclared NAME, a typo,
    # was taken and never called, the declared endpoint left to the built-in demo.)
    endpoints = api_endpoints(args.api, {a.name for a in apis})
    scratch = contextlib.ExitStack()
    with scratch:
        runtime = runtime_config(args, scratch)
        http = ServeOptions(
            host=args.host,
            port=args.port,
            token=token,
            clients=getattr(args, "clients", {}),
            tenant_max_pending=getattr(args, "tenant_max_pending", None),
            tenant_max_trajectories=getattr(args, "tenant_max_trajectories", None),
            trace_path=args.trace,
            max_output_bytes=args.max_output_bytes,
            limits=ConnectionLimits(
                header_timeout_s=args.header_timeout_s,
                body_timeout_s=args.body_timeout_s,
                max_connections=args.max_connections,
                max_connections_per_client=getattr(args, "max_connections_per_client", None),
                tenant_max_connections=getattr(args, "tenant_max_connections", None),
            ),
        )
        # Each node's agent runs its own AOE: the warm pool's bounds are per node, and each
        # CPU agent prewarms ``--prewarm`` /run_code containers (as ``tangram serve`` does).
        pool = WarmPoolConfig(max_per_key=args.warm_pool, max_total=args.warm_pool_total)
        config = RayConfig(
            namespace=NAMESPACE,
            runtime=runtime,
            apis=apis,
            endpoints=endpoints,
            http=http,
            cluster=cluster,
            join_new_nodes=not args.ray_fixed_nodes,
            aoe={"warm_pool": pool},
            prewarm=args.prewarm or 0,
        )
        ray.init(address=args.ray, namespace=NAMESPACE, log_to_driver=False)
        done = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: done.set())
        handle, info = start(config)
        try:
            info = {**info, "ray": args.ray, "token": bool(token)}
            if args.json:
                print(json.dumps(info), flush=True)
            else:
                print(
                    f"tangram serve: on Ray, listening on {info['url']} ({json.dumps(info)})",
                    flush=True,
                )
            done.wait()
        finally:
            stop(config, handle)
            ray.shutdown()
    print("tangram serve: stopped", file=sys.stderr)
    return 0
