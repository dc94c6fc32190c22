"""A finished run is not resumed: ``resume=`` of a run that reached its ``train.total_frames``
would make more updates, evaluate a second time and overwrite its summary.json."""

from __future__ import annotations

from pathlib import Path

from dreamer.config import Config
from dreamer.errors import UserError


def refuse_finished_run(run_dir: Path, cfg: Config, state: dict) -> None:
    """One line when the checkpoint to resume from is already at ``cfg.train.total_frames``
    (the resumed config: a raised train.total_frames on the command line continues the run)."""
    frames = state["counters"]["frames"]
    if frames >= cfg.train.total_frames:
        raise UserError(
            f"resume={run_dir}: the run is finished (frames={frames} of train.total_frames="
            f"{cfg.train.total_frames}); to train it further raise train.total_frames, "
            f"e.g. resume={run_dir} train.total_frames={2 * cfg.train.total_frames}"
        )
