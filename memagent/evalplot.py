"""Accuracy-vs-length figures from `memagent eval` folders (like Figure 1 of the MemAgent paper).

Kept apart from eval.py so the harness reads top to bottom; matplotlib is imported only when drawing.
"""
from __future__ import annotations

import json
from pathlib import Path

from .eval import read_records, summarize
from .tasks import format_length


def load_run(d: str | Path) -> tuple[dict, list[dict]]:
    d = Path(d)
    if not (d / "samples.jsonl").is_file():
        raise ValueError(f"{d}: no samples.jsonl (not an eval directory)")
    cfg = json.loads((d / "config.json").read_text())["config"] if (d / "config.json").is_file() else {}
    try:  # the model name the server reported (summary.json), for runs that did not name one
        cfg.setdefault("served_model", json.loads((d / "summary.json").read_text()).get("served_model"))
    except (OSError, ValueError, AttributeError):
        pass
    return cfg, summarize(list(read_records(d / "samples.jsonl").values()))


def run_label(cfg: dict, d: str | Path) -> str:
    """method (reading settings) / model: the model's name, never only the backend's kind."""
    label = cfg.get("method", "?")
    if label == "memagent":
        gates = "".join(f", {k.replace('_', '-')} {cfg[k]}" for k in ("skip_update", "early_exit")
                        if cfg.get(k, "off") != "off")
        label += f" (chunk {cfg.get('chunk_tokens')}, memory {cfg.get('memory_tokens')}{gates})"
    return label + f" / {cfg.get('model') or cfg.get('served_model') or Path(d).name}"


MARKERS = "osD^vP*X"
STYLES = ("-", "--", "-.", ":")


def figure(dirs: list[str | Path], title: str | None = None):
    """The figure: one panel per task, one line per run with +-1 standard-error bars and n in the legend.

    Runs often coincide (two methods both at 100%): each run gets its own marker and line style and a
    small sideways offset on the log axis, so a line hidden under another still shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_run(d) for d in dirs]
    task_names = sorted({r["task"] for _, rows in runs for r in rows})
    if not task_names:
        raise ValueError("nothing to plot: the directories hold no finished samples")
    cols = min(3, len(task_names))
    rows_n = (len(task_names) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.5 * cols, 4 * rows_n), squeeze=False)
    for ax, task in zip(axes.flat, task_names):
        lengths = set()
        for k, ((cfg, rows), d) in enumerate(zip(runs, dirs)):
            pts = sorted((r["length"], r["accuracy"], r.get("accuracy_se") or 0.0, r["n"]) for r in rows
                         if r["task"] == task)
            if not pts:
                continue
            lengths.update(p[0] for p in pts)
            ns = sorted({p[3] for p in pts})
            n = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}-{ns[-1]}"
            shift = 1.0 + 0.025 * (k - (len(runs) - 1) / 2)  # sideways on the log axis, centred
            ax.errorbar([p[0] * shift for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                        marker=MARKERS[k % len(MARKERS)], linestyle=STYLES[k % len(STYLES)], capsize=3,
                        alpha=0.85, markersize=6, label=f"{run_label(cfg, d)}, {n}")
        metric = next((r["metric"] for _, rows in runs for r in rows if r["task"] == task), "")
        ax.set_xscale("log")
        ax.set_xticks(sorted(lengths), [format_length(x) for x in sorted(lengths)], rotation=45)
        ax.minorticks_off()
        ax.set_ylim(-2, 102)
        ax.set_xlabel("document length (tokens)")
        ax.set_ylabel(f"accuracy (% {metric}, ±1 s.e.)")
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(task_names):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot(dirs: list[str | Path], png: str | Path, title: str | None = None) -> Path:
    """Accuracy vs length (log x), one line per run (method / model), one panel per task."""
    fig = figure(dirs, title)  # picks the Agg backend before pyplot is imported
    import matplotlib.pyplot as plt

    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
