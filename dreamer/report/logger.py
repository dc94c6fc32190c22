"""Run outputs: TorchRL logger (W&B or CSV), metrics.jsonl, videos, learning curve, summary.json.

Everything lands in the run directory (Hydra's output dir), so a run is one
folder: config, metrics, checkpoints, videos, summary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torchrl.record.loggers import Logger, get_logger

from dreamer.config import LoggerConfig


class RunLogger:
    """``run_name`` names the run in W&B; ``config`` (the whole config as a dict)
    is stored with it. ``enabled=False`` (data-parallel ranks other than 0)
    writes nothing."""

    def __init__(self, logger_cfg: LoggerConfig, run_dir: Path, *, run_name: str, config: dict,
                 enabled: bool = True):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.logger: Logger | None = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        lc = logger_cfg
        if lc.backend == "wandb":
            from torchrl.record.loggers.wandb import WandbLogger

            self.logger = WandbLogger(
                run_name, save_dir=str(self.run_dir), project=lc.project,
                offline=lc.mode == "offline", mode=lc.mode,
                config=config, group=lc.group, tags=list(lc.tags),
                # torchrl defaults to resume="allow", which asks the server (and
                # prompts for a login) even offline.
                resume=None,
            )
        elif lc.backend == "csv":
            self.logger = get_logger("csv", logger_name=str(self.run_dir), experiment_name="csv")

    def log(self, record: dict) -> None:
        """One line of metrics.jsonl (frames and updates always present)."""
        if not self.enabled:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.logger is not None:
            step = record["frames"]
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "frames":
                    self.logger.log_scalar(key, value, step=step)

    def rewind(self, updates: int) -> None:
        """Drop metrics.jsonl lines past ``updates`` (and a line torn by a kill), atomically.

        A resumed run restarts from its checkpoint; the lines the killed run
        logged after it would otherwise make frames/updates go backwards.
        """
        if not self.enabled:
            return
        if not self.metrics_path.exists():
            return
        kept = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("updates", 0) <= updates:
                kept.append(line + "\n")
        tmp = self.metrics_path.with_name(".metrics.jsonl.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.metrics_path)

    def log_video(self, frames: torch.Tensor, tag: str, frames_seen: int, fps: int = 15) -> Path:
        """(T, H, W, C) uint8 -> videos/<tag>_<frames>.mp4 (and W&B when used)."""
        import imageio

        path = self.run_dir / "videos" / f"{tag}_{frames_seen:010d}.mp4"
        path.parent.mkdir(exist_ok=True)
        imageio.mimwrite(path, frames.numpy(), fps=fps, macro_block_size=1)
        if self._is_wandb():
            import wandb

            self.logger.experiment.log({tag: wandb.Video(str(path), format="mp4")}, step=frames_seen)
        return path

    def write_summary(self, summary: dict) -> None:
        if not self.enabled:
            return
        tmp = self.run_dir / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, self.run_dir / "summary.json")

    def log_learning_curve(self, frames_seen: int) -> Path | None:
        """learning_curve.png from this run's metrics.jsonl (and to W&B when used)."""
        if not self.enabled:
            return None
        from dreamer.report.plots import load_run, plot_runs

        path = plot_runs([load_run(self.run_dir)], self.run_dir / "learning_curve.png")
        if self._is_wandb():
            import wandb

            self.logger.experiment.log({"learning_curve": wandb.Image(str(path))}, step=frames_seen)
        return path

    def _is_wandb(self) -> bool:
        return self.logger is not None and self.logger.__class__.__name__ == "WandbLogger"

    def close(self) -> None:
        if self.logger is not None and hasattr(self.logger, "experiment"):
            finish = getattr(self.logger.experiment, "finish", None)
            if callable(finish):
                finish()
