"""Run outputs: TorchRL logger (W&B or CSV), metrics.jsonl, videos, learning curve, summary.json.

Everything lands in the run directory (Hydra's output dir), so a run is one
folder: config, metrics, checkpoints, videos, summary.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import string
from pathlib import Path

import torch
from torchrl.record.loggers import Logger, get_logger
from torchrl.record.loggers.csv import CSVLogger

from dreamer.config import LoggerConfig
from dreamer.errors import UserError
from dreamer.report.rewind import METRICS_NAME, describe, rewind_records, scalars

log = logging.getLogger("dreamer")

# {"run_id": ..., "attempts": N}: the W&B run id of a run directory, from its first
# start on, and how many times it was started. Not wandb's own wandb/wandb-resume.json:
# wandb deletes that one unless resume="auto".
RUN_ID_FILE = "wandb_run.json"
# In every W&B row: which start of the run directory logged it (0 for the first).
# Where W&B cannot rewind a run to its checkpoint, rows an attempt logged past
# the checkpoint stay; for each step the row with the highest segment is current.
SEGMENT_KEY = "resume_segment"


def check_video_writer(writes_videos: bool) -> None:
    """Checked before a run starts: without imageio's ffmpeg plugin the first
    evaluation's video would fail (or imageio would pick another writer for .mp4,
    tifffile where installed, and fail on its arguments), long after the start."""
    if not writes_videos:
        return
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        raise UserError("videos need imageio-ffmpeg, which is not installed: pip install imageio-ffmpeg, "
                        "or turn them off with eval.video=false eval.openloop=false") from None


def _new_run_id() -> str:
    """8 characters of [a-z0-9], as wandb's own ids (wandb.util.generate_id is gone in wandb 0.31)."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunLogger:
    """``run_name`` names the run in W&B; ``config`` (the whole config as a dict)
    is stored with it. ``enabled=False`` (data-parallel ranks other than 0)
    writes nothing.

    ``saved_state``: :meth:`state_dict` from the checkpoint a resumed run
    starts from. A W&B run keeps one run id for its whole run directory: the
    id in the checkpoint, else the one in ``wandb_run.json`` (written
    at the first start, so an attempt that died before its first checkpoint
    is continued too), else a new one.

    An online run resumed from a checkpoint is rewound on the server to the
    history step the checkpoint recorded (wandb's ``resume_from``), so rows
    logged past the checkpoint are dropped there too. Where that is not
    possible (offline runs, a server that refuses it, an attempt that died
    before its first checkpoint) :meth:`rewind` says so in one line, and every
    row carries :data:`SEGMENT_KEY`.
    """

    def __init__(self, logger_cfg: LoggerConfig, run_dir: Path, *, run_name: str, config: dict,
                 enabled: bool = True, saved_state: dict | None = None):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.logger: Logger | None = None
        self.mode = logger_cfg.mode
        self.segment = 0  # this start of the run directory (SEGMENT_KEY)
        self.rewound_on_server = False  # W&B dropped the rows past the checkpoint itself
        self.no_server_rewind = "offline runs cannot be rewound"  # why not, for the rewind's line
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_NAME
        lc = logger_cfg
        if lc.backend == "wandb":
            self.logger = self._wandb_logger(lc, run_name, config, saved_state or {})
        elif lc.backend == "csv":
            self.logger = get_logger("csv", logger_name=str(self.run_dir), experiment_name="csv")

    def _wandb_logger(self, lc: LoggerConfig, run_name: str, config: dict, saved: dict) -> Logger:
        from torchrl.record.loggers.wandb import WandbLogger

        saved_id = saved.get("local", {}).get("id") if saved.get("backend") == "wandb" else None
        run_id = saved_id or self._read_run_id()
        if lc.mode != "online":
            # Offline, wandb ignores resume= (nothing asks a server): every attempt
            # writes its own offline-run-<time>-<id> folder, and `wandb sync` uploads
            # the folders of one id as one run, in start order.
            resume = None
        elif saved_id and saved.get("mode") == "online":
            resume = "must"  # the checkpoint's run exists on the server
            self.no_server_rewind = "the checkpoint records no W&B history step"
        elif run_id:
            resume = "allow"  # an attempt before the first checkpoint, or a run started offline
            self.no_server_rewind = "the attempt before died before its first checkpoint"
        else:
            resume = None
        if run_id is None:
            run_id = _new_run_id()
        if lc.mode != "disabled":
            self.segment = self._record_start(run_id)
        common = dict(
            save_dir=str(self.run_dir), project=lc.project, offline=lc.mode == "offline", mode=lc.mode, id=run_id,
            config=config, group=lc.group, tags=list(lc.tags),
        )
        history_step = saved.get("history_step")
        if resume == "must" and history_step is not None:
            try:
                logger = WandbLogger(run_name, resume=None, resume_from=f"{run_id}?_step={history_step}", **common)
            except Exception as err:  # rewind is a W&B preview feature: not every server or account has it
                self.no_server_rewind = f"W&B refused resume_from: {(str(err).splitlines() or [''])[0][:160]}"
            else:
                self.rewound_on_server = True
                log.info("W&B run %s rewound to the checkpoint's history step %d (resume_from)", run_id, history_step)
                return logger
        # torchrl defaults to resume="allow", which asks the server (and prompts
        # for a login); only an online run resumes.
        return WandbLogger(run_name, resume=resume, **common)

    @property
    def _run_id_path(self) -> Path:
        return self.run_dir / RUN_ID_FILE

    def _read_id_file(self) -> dict:
        try:
            saved = json.loads(self._run_id_path.read_text())
        except (OSError, ValueError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def _read_run_id(self) -> str | None:
        return self._read_id_file().get("run_id") or None

    def _record_start(self, run_id: str) -> int:
        """Write the run id and count this start; returns the starts before it."""
        saved = self._read_id_file()
        before = saved.get("attempts", 1 if saved.get("run_id") else 0)
        before = before if isinstance(before, int) else 0
        _replace(self._run_id_path, json.dumps({"run_id": run_id, "attempts": before + 1}) + "\n")
        return before

    # -- checkpoint -----------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain types only (checkpoints load with weights_only=True): the W&B
        logger's state (run id, step registry) from TorchRL's ``Logger.state_dict``."""
        if not self.enabled or not self._is_wandb():
            return {}
        return {"backend": "wandb", "mode": self.mode, "history_step": self._history_step(),
                **self.logger.state_dict()}

    def _history_step(self) -> int | None:
        """W&B's ``_step`` of the next row: where a resume from this checkpoint rewinds the run to."""
        try:
            return int(self.logger.experiment.step)
        except Exception:  # a mode without a history step (shared runs, a disabled run)
            return None

    def load_state_dict(self, state: dict) -> None:
        """The W&B step registry from the checkpoint (its run id was used at construction)."""
        if self._is_wandb() and state.get("backend") == "wandb":
            self.logger.load_state_dict(state)

    # -- records --------------------------------------------------------------
    def log(self, record: dict) -> None:
        """One line of metrics.jsonl (frames and updates always present), and
        one logger record (one W&B history row) at step = env frames."""
        if not self.enabled:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.logger is not None:
            self.logger.log_metrics({**scalars(record), **self._segment()}, step=record["frames"])

    def rewind(self, updates: int) -> None:
        """Cut the local records back to a checkpoint at ``updates``
        (dreamer.report.rewind: metrics.jsonl and the CSVs by the same key), in one
        line saying what was removed; and one line when W&B keeps rows logged past
        the checkpoint (it could not be rewound there)."""
        if not self.enabled:
            return
        removed = rewind_records(self.run_dir, updates)
        if removed:
            log.info("records rewound to the checkpoint at updates=%d: removed %s", updates, describe(removed))
        if isinstance(self.logger, CSVLogger):  # files it opened before the rewind: reopened at the next row
            for handle in self.logger.experiment.files.values():
                handle.close()
            self.logger.experiment.files.clear()
        past = removed.get(METRICS_NAME, 0)
        if past and self._is_wandb() and self.mode != "disabled" and not self.rewound_on_server:
            log.warning("W&B keeps the %d record(s) logged past the checkpoint (%s): this attempt's rows carry "
                        "%s=%d; for each step the row with the highest %s is current", past, self.no_server_rewind,
                        SEGMENT_KEY, self.segment, SEGMENT_KEY)

    def _segment(self) -> dict:
        return {SEGMENT_KEY: self.segment} if self._is_wandb() else {}

    def log_video(self, frames: torch.Tensor, tag: str, frames_seen: int, fps: int = 15) -> Path:
        """(T, H, W, C) uint8 -> videos/<tag>_<frames>.mp4 (and W&B when used)."""
        import imageio

        path = self.run_dir / "videos" / f"{tag}_{frames_seen:010d}.mp4"
        path.parent.mkdir(exist_ok=True)
        # The ffmpeg plugin by name: by extension imageio may pick another installed writer.
        imageio.mimwrite(path, frames.numpy(), format="FFMPEG", fps=fps, macro_block_size=1)
        if self._is_wandb():
            import wandb

            # Through the logger's own step convention (step = env frames, one row);
            # its log_video would encode the frames again and needs moviepy.
            self.logger.log_metrics({tag: wandb.Video(str(path), format="mp4"), **self._segment()},
                                    step=frames_seen)
        return path

    def write_summary(self, summary: dict) -> None:
        if not self.enabled:
            return
        tmp = self.run_dir / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, self.run_dir / "summary.json")

    def log_learning_curve(self, frames_seen: int) -> Path | None:
        """learning_curve.png from this run's metrics.jsonl (and to W&B when used); None
        when the run stopped before its first record (nothing to draw)."""
        if not self.enabled or not self.metrics_path.exists():
            return None
        from dreamer.report.plots import load_run, plot_runs

        path = plot_runs([load_run(self.run_dir)], self.run_dir / "learning_curve.png")
        if self._is_wandb():
            import wandb

            self.logger.log_metrics({"learning_curve": wandb.Image(str(path)), **self._segment()},
                                    step=frames_seen)
        return path

    def _is_wandb(self) -> bool:
        return self.logger is not None and self.logger.__class__.__name__ == "WandbLogger"

    def close(self) -> None:
        if self.logger is not None and hasattr(self.logger, "experiment"):
            finish = getattr(self.logger.experiment, "finish", None)
            if callable(finish):
                finish()
