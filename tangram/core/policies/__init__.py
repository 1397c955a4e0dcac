"""Policies registered by name: ``make_policy("tangram")``, ``make_policy("fixed:16")``.

A name may carry one integer argument after a colon. The registry is a plain dict so the CLI,
config files and tests can list and name policies.
"""

from __future__ import annotations

from collections.abc import Callable

from tangram.core.policies.base import CompositePolicy, DomainRule, Policy
from tangram.core.policies.elastic import ElasticCpu
from tangram.core.policies.elastic_gpu import ElasticGpu
from tangram.core.policies.fifo_api import FifoApi
from tangram.core.policies.fixed import FixedCpu, FixedGpu
from tangram.core.policies.lower_bound import LowerBound
from tangram.core.policies.static import BurstablePods, DedicatedGpus, SizedGpus, StaticPods
from tangram.core.policies.tuning import EXCLUSIVE, PAPER, ROBUST, ElasticTuning

#: Cores per pod of the Kubernetes baseline when none is given (``k8s-static:K`` overrides).
DEFAULT_POD_CORES = 4
#: GPUs dedicated to each service by the SGLang baseline (MOPD in the paper: 9 teachers x 4).
DEFAULT_GPUS_PER_SERVICE = 4


def _elastic(label: str, base: ElasticTuning) -> Callable[[int | None], Policy]:
    """``tangram`` / ``tangram-paper``; ``:K`` fixes the candidate window at K."""

    def make(arg: int | None) -> Policy:
        tuning = base if arg is None else base.with_window(arg)
        name = label if arg is None else f"{label}:{arg}"
        return CompositePolicy(name, cpu=ElasticCpu(tuning), gpu=ElasticGpu(tuning), api=FifoApi())

    return make


def _fixed(arg: int | None) -> Policy:
    if arg is None:
        raise ValueError("fixed needs its DoP: 'fixed:K', e.g. fixed:4")
    return CompositePolicy(f"fixed:{arg}", cpu=FixedCpu(arg), gpu=FixedGpu(arg), api=FifoApi())


def _k8s(arg: int | None) -> Policy:
    k = arg or DEFAULT_POD_CORES
    return CompositePolicy(
        f"k8s-static:{k}",
        cpu=StaticPods(k),
        gpu=DedicatedGpus(DEFAULT_GPUS_PER_SERVICE),
        api=FifoApi(),
    )


def _k8s_burstable(arg: int | None) -> Policy:
    r = arg or DEFAULT_POD_CORES
    return CompositePolicy(
        f"k8s-burstable:{r}",
        cpu=BurstablePods(r),
        gpu=DedicatedGpus(DEFAULT_GPUS_PER_SERVICE),
        api=FifoApi(),
    )


def _sglang(arg: int | None) -> Policy:
    g = arg or DEFAULT_GPUS_PER_SERVICE
    return CompositePolicy(
        f"sglang-static:{g}", cpu=StaticPods(DEFAULT_POD_CORES), gpu=DedicatedGpus(g), api=FifoApi()
    )


def _sglang_sized(arg: int | None) -> Policy:
    label = "sglang-sized" if arg is None else f"sglang-sized:{arg}"
    return CompositePolicy(
        label, cpu=StaticPods(DEFAULT_POD_CORES), gpu=SizedGpus(arg), api=FifoApi()
    )


def _lower_bound(arg: int | None) -> Policy:
    """The bound has nothing to size: an argument is refused, not silently dropped."""
    if arg is not None:
        raise ValueError(f"policy 'lower-bound:{arg}': lower-bound takes no argument after ':'")
    return LowerBound()


#: name -> factory(optional integer argument). The static baselines are static for every kind:
#: ``k8s-static:K`` sets the pod size, ``k8s-burstable:R`` the pod's CPU requests, ``sglang-static:G`` the GPUs per service,
#: ``sglang-sized:G`` the GPUs split among services by expected load (default: all of them).
POLICIES: dict[str, Callable[[int | None], Policy]] = {
    "tangram": _elastic("tangram", ROBUST),
    "tangram-paper": _elastic("tangram-paper", PAPER),
    # The default's rules on exclusive cores (its grants lend no idle cycles): what a driver
    # that cannot share a node's cores runs, and the assumption varied in the experiments.
    "tangram-exclusive": _elastic("tangram-exclusive", EXCLUSIVE),
    "fixed": _fixed,
    "k8s-static": _k8s,
    "k8s-burstable": _k8s_burstable,
    "sglang-static": _sglang,
    "sglang-sized": _sglang_sized,
    "lower-bound": _lower_bound,
}


def make_policy(spec: str) -> Policy:
    """Build a fresh policy object from ``name`` or ``name:K``."""
    name, colon, arg = spec.partition(":")
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {spec!r}; known: {sorted(POLICIES)} (some take ':K')")
    if colon and not arg:
        raise ValueError(f"policy {spec!r}: nothing after ':' (give {name}:K or just {name})")
    value: int | None = None
    if arg:
        try:
            value = int(arg)
        except ValueError:
            raise ValueError(
                f"policy {spec!r}: the argument after ':' must be an integer"
            ) from None
        if value < 1:
            raise ValueError(f"policy {spec!r}: the argument must be >= 1")
    return factory(value)


__all__ = ["POLICIES", "CompositePolicy", "DomainRule", "Policy", "make_policy"]
