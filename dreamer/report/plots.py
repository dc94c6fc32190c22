"""Learning curves from run directories: eval return vs frames (mean ± std over
seeds) and updates/s, drawn to a PNG. Used at the end of every run (its own
curve, also sent to W&B) and by ``scripts/plot_runs.py`` (many runs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dreamer.errors import UserError
from dreamer.report.eval_metrics import eval_return

# Keys that differ between seeds of one experiment without making it another one.
_NOT_THE_EXPERIMENT = ("seed", "logger", "eval", "checkpoint", "resume", "profiling")


@dataclass
class Run:
    path: Path
    label: str  # runs with the same label are seeds of one curve
    eval_frames: np.ndarray
    eval_returns: np.ndarray
    eval_minutes: np.ndarray  # wall time of each evaluation since the run started
    rate_frames: np.ndarray
    updates_per_s: np.ndarray


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding metrics.jsonl) under the given paths, e.g. a
    Hydra multirun directory expands to its numbered job directories."""
    runs = []
    for path in map(Path, paths):
        if (path / "metrics.jsonl").is_file():
            found = [path]
        else:
            found = sorted(p.parent for p in path.glob("*/metrics.jsonl")) if path.is_dir() else []
        if not found:
            raise UserError(f"{path}: no metrics.jsonl here or one level below; pass run directories")
        runs.extend(found)
    return runs


def _label(config: dict) -> str:
    """Experiment, env, model size and the evaluated policy (runs of two sizes, or evaluated
    by sampling and by the mode, are two curves, not seeds of one)."""
    policy = config.get("eval", {}).get("policy")
    parts = [config.get("experiment", "?"), config.get("env", {}).get("name", ""), config.get("model") or "",
             f"({policy} policy)" if policy else ""]
    return " ".join(p for p in parts if p)


def load_run(path: Path) -> Run:
    records = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    config_path = path / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    evals = [r for r in records if eval_return(r) is not None]
    rates = [r for r in records if "updates_per_s" in r]
    return Run(
        path=path, label=_label(config),
        eval_frames=np.array([r["frames"] for r in evals], dtype=float),
        eval_returns=np.array([eval_return(r) for r in evals], dtype=float),
        eval_minutes=np.array([r["wall_s"] / 60.0 for r in evals], dtype=float),
        rate_frames=np.array([r["frames"] for r in rates], dtype=float),
        updates_per_s=np.array([r["updates_per_s"] for r in rates], dtype=float),
    )


def mean_std(xs: list[np.ndarray], ys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Curves sampled at different frames -> mean and std on the union of their
    frames, each curve interpolated only inside the range it covers."""
    xs_ys = [(x, y) for x, y in zip(xs, ys) if len(x)]
    if not xs_ys:
        return np.array([]), np.array([]), np.array([])
    grid = np.unique(np.concatenate([x for x, _ in xs_ys]))
    stacked = np.full((len(xs_ys), len(grid)), np.nan)
    for i, (x, y) in enumerate(xs_ys):
        inside = (grid >= x.min()) & (grid <= x.max())
        stacked[i, inside] = np.interp(grid[inside], x, y)
    with np.errstate(all="ignore"):
        return grid, np.nanmean(stacked, axis=0), np.nanstd(stacked, axis=0)


def plot_runs(runs: list[Run], out: Path, x_axis: str = "frames") -> Path:
    """Eval return (mean ± std over the runs sharing a label) and updates/s vs frames;
    ``x_axis="minutes"`` puts the eval return against wall-clock minutes instead."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters
    import matplotlib.pyplot as plt

    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    fig, (ax_ret, ax_rate) = plt.subplots(1, 2, figsize=(11, 4))
    for label, members in groups.items():
        name = f"{label} ({len(members)} run{'s' if len(members) > 1 else ''})"
        eval_x = [r.eval_minutes if x_axis == "minutes" else r.eval_frames for r in members]
        x, mean, std = mean_std(eval_x, [r.eval_returns for r in members])
        line, = ax_ret.plot(x, mean, marker="o", markersize=3, label=name)
        ax_ret.fill_between(x, mean - std, mean + std, alpha=0.25, color=line.get_color())
        x, mean, std = mean_std([r.rate_frames for r in members], [r.updates_per_s for r in members])
        ax_rate.plot(x, mean, color=line.get_color(), label=name)
        ax_rate.fill_between(x, mean - std, mean + std, alpha=0.25, color=line.get_color())
    ax_ret.set(xlabel="wall-clock minutes" if x_axis == "minutes" else "env frames", ylabel="eval return",
               title="Eval return (mean ± std over seeds)")
    ax_rate.set(xlabel="env frames", ylabel="updates / s", title="Learner throughput")
    for ax in (ax_ret, ax_rate):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
