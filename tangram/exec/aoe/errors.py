"""The errors of the AOE executor, each naming what went wrong and what to do about it."""

from __future__ import annotations


class AoeError(RuntimeError):
    """Base class of every error the AOE executor raises."""


class EngineUnavailable(AoeError):
    """The Docker engine cannot be reached (or the docker SDK is not installed)."""


class ImageMissing(AoeError):
    """The image a trajectory asks for is not in the local engine (nothing can be pulled)."""


class UnknownTrajectory(AoeError):
    """An action or a close names a trajectory that has no open container."""


class GrantError(AoeError):
    """A core grant that can never be satisfied (unknown cores, a bad quota, too many cores)."""
