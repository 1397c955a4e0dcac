"""Suite-wide settings: hypothesis without per-example deadlines (CI has 2 shared cores) and,
under CI, derandomized so a red run is reproducible from its log."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "tangram",
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("tangram")
