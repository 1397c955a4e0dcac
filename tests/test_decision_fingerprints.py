"""The recorded decision fingerprints still hold (``scripts/decision_fingerprint.py``).

The file had gone stale twice without anyone seeing it: an intended change of the default's
decisions (stop 21, grants lending idle cycles) and of the usage timeline (a driver-loop
fix) left 13 of 36 cases different until stop 26 re-recorded them. The cases under a second
each run here, so a change that moves a decision fails the suite until it is re-recorded
(``--write``) on purpose, in a commit that says why.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The cheap cases: local and small-GPU clusters, every policy kind and both tangram policies.
FAST = (
    "coding-local-tangram", "coding-local-tangram-paper", "coding-local-fixed16",
    "coding-memory-tangram", "coding-memory-k8s", "coding-open-local-k8s",
    "mopd-local-tangram", "mopd-local-tangram-paper", "mopd-gpu8-fixed1", "mopd-gpu16-sglang",
    "mopd-paper-sglang", "mopd-paper-fixed4", "mopd-open-tangram",
    "deepsearch-local-tangram", "deepsearch-local-tangram-paper", "deepsearch-local-sglang",
    "deepsearch-rate-tangram", "deepsearch-rate-open-k8s",
)  # fmt: skip


def test_the_fast_cases_decide_as_recorded() -> None:
    recorded = ROOT / "scripts" / "decision-fingerprints.json"
    script = ROOT / "scripts" / "decision_fingerprint.py"
    run = subprocess.run(
        [sys.executable, str(script), "--check", str(recorded), "--only", *FAST],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert f"{len(FAST)} of {len(FAST)} replays identical" in run.stdout
