"""Figures of a comparison: ACT CDFs, the ACT breakdown, and held vs busy resources over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def comparison_figure(
    actions: dict[str, pd.DataFrame], timelines: dict[str, pd.DataFrame], path: Path
) -> Path:
    """Three panels: ACT CDF per policy, mean ACT split into queue/overhead/execution, held cores."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for name, df in actions.items():
        act = np.sort(df.loc[df["outcome"] == "result", "act_s"].to_numpy())
        if act.size:
            ax.plot(act, np.arange(1, act.size + 1) / act.size, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("action completion time (s)")
    ax.set_ylabel("fraction of actions")
    ax.set_title("ACT CDF")
    _legend(ax)
    ax.grid(alpha=0.3)

    ax = axes[1]
    names = list(actions)
    parts = {"queue_s": "queueing", "overhead_s": "overhead", "exec_s": "execution"}
    bottom = np.zeros(len(names))
    for col, label in parts.items():
        vals = np.array(
            [actions[n].loc[actions[n]["outcome"] == "result", col].mean() for n in names]
        )
        ax.bar(names, vals, bottom=bottom, label=label)
        bottom += np.nan_to_num(vals)
    ax.set_ylabel("mean seconds per action")
    ax.set_title("ACT breakdown")
    ax.legend()

    ax = axes[2]
    for name, tl in timelines.items():
        if not tl.empty:
            ax.step(
                tl["time"], tl["held_cores"] + tl["held_gpus"], where="post", label=f"{name} held"
            )
            ax.step(
                tl["time"],
                tl["busy_cores"] + tl["busy_gpus"],
                where="post",
                linestyle=":",
                label=f"{name} busy",
            )
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("cores + GPUs")
    ax.set_title("resources held vs busy")
    _legend(ax, fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _legend(ax: plt.Axes, **kwargs: object) -> None:
    """A legend where the panel drew a curve: with no action run (every one rejected) there is
    none, and matplotlib warned 'No artists with labels found' on tangram sim's stderr."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)
