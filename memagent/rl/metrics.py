"""Per-step metrics as JSON lines, and a PNG of the curves drawn from that file alone."""
from __future__ import annotations

import json
from pathlib import Path

CURVES = [("reward", "mean reward"), ("accuracy", "accuracy"), ("groups_kept", "groups kept"),
          ("entropy", "entropy"), ("kl", "KL to reference"), ("clip_frac", "clip fraction"),
          ("memory_len", "memory update length (tokens)"), ("truncated_frac", "turns cut at cap")]


def append(path: str | Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read(path: str | Path) -> list[dict]:
    """Records by step; a step repeated after a resume keeps its last record."""
    by_step: dict[int, dict] = {}
    p = Path(path)
    if p.is_file():
        for line in p.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                by_step[r["step"]] = r
    return [by_step[s] for s in sorted(by_step)]


def plot(records: list[dict], png: str | Path, title: str = "Multi-Conv DAPO", smooth: int = 5) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [(k, label) for k, label in CURVES if any(k in r for r in records)]
    cols = 2
    rows = max(1, (len(curves) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(10, 2.6 * rows), squeeze=False)
    for ax, (key, label) in zip(axes.flat, curves):
        xs = [r["step"] for r in records if key in r and r[key] is not None]
        ys = [r[key] for r in records if key in r and r[key] is not None]
        ax.plot(xs, ys, ".", alpha=0.4, color="tab:blue")
        if len(ys) >= smooth:
            avg = [sum(ys[max(0, i - smooth + 1): i + 1]) / len(ys[max(0, i - smooth + 1): i + 1]) for i in range(len(ys))]
            ax.plot(xs, avg, "-", color="tab:blue", label=f"mean of last {smooth}")
            ax.legend(fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(curves):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
