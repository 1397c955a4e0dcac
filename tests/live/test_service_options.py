"""The service's own settings refuse, naming them, values no request could be served with:
``max_wait_s`` (a NaN took no cap at all: ``min(wait, nan)`` is ``wait``, so a ``wait: true``
held its connection without end; 0 or less answered every wait with a 202 at once; ``True``
was 1 s), ``body_timeout_s`` (0 refused every body with a 408) and ``max_output_bytes`` of
the app (a boolean or 0 capped every CPU action's output at 1 byte or refused them all)."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.service import ServeOptions
from tangram.exec.service.app import ServiceApp

CLUSTER = ClusterSpec(name="options", apis=(ApiEndpointSpec("echo", concurrency=4),))


def runtime() -> Runtime:
    return Runtime(CLUSTER, RuntimeConfig(), api=ApiExecutor({"echo": echo}))


BAD_SECONDS = [0, -1.0, float("nan"), True, "300", None]


@pytest.mark.parametrize("bad", BAD_SECONDS, ids=repr)
@pytest.mark.parametrize("field", ["max_wait_s", "body_timeout_s"])
def test_the_app_refuses_a_wait_or_body_time_out_that_is_not_seconds(field: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=field):
        ServiceApp(runtime(), **{field: bad})


@pytest.mark.parametrize("bad", [0, True, 1.5, None, (1 << 30) + 1], ids=repr)
def test_the_app_refuses_an_output_cap_that_is_not_a_count(bad: Any) -> None:
    # (Above AOE's most, 1 GiB, every action asking for the cap was accepted and then refused
    # by AOE.)
    with pytest.raises(ValueError, match="max_output_bytes"):
        ServiceApp(runtime(), max_output_bytes=bad)


@pytest.mark.parametrize("bad", BAD_SECONDS, ids=repr)
def test_serve_options_refuse_a_max_wait_that_is_not_seconds(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_wait_s"):
        ServeOptions(max_wait_s=bad)


def test_good_settings_are_kept() -> None:
    app = ServiceApp(runtime(), max_wait_s=float("inf"), body_timeout_s=5, max_output_bytes=10)
    assert app.max_wait_s == float("inf") and app.body_timeout_s == 5
    assert ServeOptions(max_wait_s=30).max_wait_s == 30


def test_an_action_asking_more_output_than_aoe_keeps_is_refused_naming_it() -> None:
    """A CPU action's ``max_output_bytes`` above AOE's most (1 GiB) was accepted by the
    runtime and refused by AOE when it ran, as an executor error."""
    from tangram.exec.runtime import CpuWork
    from tangram.exec.runtime.errors import BadRequest

    CpuWork("true", max_output_bytes=1 << 30).check()
    with pytest.raises(BadRequest, match="max_output_bytes"):
        CpuWork("true", max_output_bytes=(1 << 30) + 1).check()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--memory-gb", "-1"], "--memory-gb"),
        (["--memory-gb", "nan"], "--memory-gb"),
        (["--default-timeout-s", "nan"], "--default-timeout-s"),
        (["--default-timeout-s", "0"], "--default-timeout-s"),
        (["--max-pending", "0"], "--max-pending"),
        (["--header-timeout-s", "0"], "--header-timeout-s"),
        (["--body-timeout-s", "-1"], "--body-timeout-s"),
        (["--max-connections", "0"], "--max-connections"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_serve_names_the_flag_of_a_bad_setting(
    capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    """``tangram serve --memory-gb -1`` said "default_memory_gb must be a positive finite
    number" (``--max-pending 0`` "max_pending ...", ``--header-timeout-s 0``
    "header_timeout_s ..."): the settings' own names, not the flag the operator typed."""
    from tangram.cli import main as cli_main

    try:
        code = cli_main(["serve", "--no-cpu", "--no-gpu", "--no-journal", "--port", "0", *flags])
    except SystemExit as exit_:  # argparse's own refusal of a flag's value
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err, err
