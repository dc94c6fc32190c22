"""What a run returns: one type for every way it ends (``finished_by``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FINISHED_BY = ("total_frames", "max_minutes", "signal", "preempted")


@dataclass
class RunResult:
    """``finished_by``: total_frames (done), max_minutes (wall-clock budget), signal
    (stopped early, summary written) or preempted (checkpointed for a requeueing
    scheduler to resume: no final eval, no summary, the throughput fields stay None)."""

    finished_by: str
    run_dir: Path
    frames: int
    updates: int
    stopped_by: str | None = None  # the stop signal's name, when one arrived
    wall_s: float | None = None
    updates_per_s: float | None = None
    frames_per_s: float | None = None
    train_ratio_achieved: float | None = None
    eval_policy: str = "sample"  # eval.policy: the final evaluation's returns are of this policy
    eval_return_mean: float | None = None
    eval_return_std: float | None = None
    eval_episodes: int = 0
    timers: dict = field(default_factory=dict)  # random_phase_s, compile_warmup_s, eval_s
    world_size: int | None = None  # data-parallel runs only
    max_param_divergence: float | None = None

    def __post_init__(self):
        if self.finished_by not in FINISHED_BY:
            raise ValueError(f"finished_by={self.finished_by!r}; one of {FINISHED_BY}")

    @property
    def preempted(self) -> bool:
        return self.finished_by == "preempted"

    def to_dict(self) -> dict:
        """summary.json for a finished run; for a preempted one, what a requeue needs."""
        if self.preempted:
            return {"preempted": True, "run_dir": str(self.run_dir), "frames": self.frames,
                    "updates": self.updates, "stopped_by": self.stopped_by, "finished_by": self.finished_by}
        ranks = {}
        if self.world_size is not None:
            ranks = {"world_size": self.world_size, "max_param_divergence": self.max_param_divergence}
        return {
            **ranks,
            "frames": self.frames,
            "updates": self.updates,
            "wall_s": self.wall_s,
            "updates_per_s": self.updates_per_s,
            "frames_per_s": self.frames_per_s,
            "train_ratio_achieved": self.train_ratio_achieved,
            "eval_policy": self.eval_policy,
            "eval_return_mean": self.eval_return_mean,
            "eval_return_std": self.eval_return_std,
            "eval_episodes": self.eval_episodes,
            "stopped_by": self.stopped_by,
            "finished_by": self.finished_by,
            **self.timers,
        }
