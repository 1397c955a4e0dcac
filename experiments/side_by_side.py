"""Figures that put the paper's policy (`tangram-paper`) and the default (`tangram`) side by side.

``run_all.py`` calls these after the runs (and with ``--docs-only``):

- ``<name>.side_by_side.png``: an experiment's figure under `tangram-paper` (``results/``) above
  the same figure under `tangram` (``results/default/``), one image to compare;
- ``side_by_side.png``: every claim given as a ratio (``...x``), both policies as bars.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

PAPER, DEFAULT = "tangram-paper", "tangram"


def stack(out: Path, name: str) -> Path | None:
    """``<name>.png`` of both runs, one above the other, in ``<name>.side_by_side.png``."""
    paths = [out / f"{name}.png", out / "default" / f"{name}.png"]
    if not all(p.exists() for p in paths):
        return None
    images = [mpimg.imread(p) for p in paths]
    width = max(im.shape[1] for im in images) / 100
    height = sum(im.shape[0] for im in images) / 100 + 0.8
    fig, axes = plt.subplots(2, 1, figsize=(width, height))
    titles = (f"{PAPER} (the paper's policy)", f"{DEFAULT} (the default policy)")
    for ax, im, title in zip(axes, images, titles, strict=True):
        ax.imshow(im)
        ax.set_title(title, fontsize=12, loc="left")
        ax.axis("off")
    path = out / f"{name}.side_by_side.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def ratio_claims(claims: pd.DataFrame) -> pd.DataFrame:
    """The claims whose figure is a ratio (``1.58 ± 0.00x``), with both policies' means."""
    if claims.empty or "default_mean" not in claims.columns:
        return pd.DataFrame()
    df = claims.copy()
    df["paper_mean"] = pd.to_numeric(df["ours_mean"], errors="coerce")
    df["default_mean"] = pd.to_numeric(df["default_mean"], errors="coerce")
    is_ratio = df["ours"].astype(str).str.match(r"^[0-9.]+( ± [0-9.]+)?x")
    return df[is_ratio & df.paper_mean.notna() & df.default_mean.notna()]


def claims_figure(claims: pd.DataFrame, out: Path, number: dict[str, int]) -> Path | None:
    """Horizontal bars: each ratio claim under both policies (log scale, 1x marked)."""
    df = ratio_claims(claims)
    if df.empty:
        return None
    labels = [f"{number.get(r.experiment, '')}. {r.claim}"[:80] for r in df.itertuples(index=False)]
    y = np.arange(len(df))
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(df) + 1.2))
    ax.barh(y - 0.2, df.paper_mean, 0.4, label=PAPER)
    ax.barh(y + 0.2, df.default_mean, 0.4, label=f"{DEFAULT} (default)")
    ax.axvline(1, color="k", lw=0.6)
    ax.set_xscale("log")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ratio as the claim states it (mean over seeds; log scale)")
    ax.set_title("The claims given as ratios, under the paper's policy and the default")
    ax.legend(fontsize=8, loc="lower right")
    path = out / "side_by_side.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
