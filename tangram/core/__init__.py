"""The scheduler core: pure, deterministic, no clock, no driver (see docs/core.md)."""

from tangram.core.action import Action, ActionError
from tangram.core.capabilities import Capabilities
from tangram.core.cluster_file import ClusterFileError, bundled_clusters, load_cluster
from tangram.core.curves import (
    Amdahl,
    CurveError,
    ElasticityCurve,
    Inelastic,
    Tabulated,
    curve_from_dict,
    fit_amdahl,
)
from tangram.core.decision import Decision, Defer, Reject, Start
from tangram.core.fastpaths import FAST, FULL, FastPaths
from tangram.core.loop import DriverLoop
from tangram.core.policies import POLICIES, make_policy
from tangram.core.resources import (
    ApiEndpointSpec,
    ClusterSpec,
    CpuNodeSpec,
    GpuNodeSpec,
    ResourceKind,
)
from tangram.core.scheduler import Scheduler

__all__ = [
    "Action",
    "ActionError",
    "Amdahl",
    "ApiEndpointSpec",
    "Capabilities",
    "ClusterFileError",
    "ClusterSpec",
    "CpuNodeSpec",
    "CurveError",
    "Decision",
    "Defer",
    "DriverLoop",
    "ElasticityCurve",
    "FAST",
    "FULL",
    "FastPaths",
    "GpuNodeSpec",
    "Inelastic",
    "POLICIES",
    "Reject",
    "ResourceKind",
    "Scheduler",
    "Start",
    "Tabulated",
    "bundled_clusters",
    "curve_from_dict",
    "fit_amdahl",
    "load_cluster",
    "make_policy",
]
