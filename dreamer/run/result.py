"""What a run returns: one type for every way it ends (``finished_by``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from pathlib import Path


class FinishedBy(str, enum.Enum):
    """How a run ended (a str: summary.json and log lines read its value)."""

    TOTAL_FRAMES = "total_frames"  # done
    MAX_MINUTES = "max_minutes"  # the wall-clock budget
    SIGNAL = "signal"  # stopped early, summary written
    PREEMPTED = "preempted"  # checkpointed for a requeueing scheduler to resume


@dataclass
class Timers:
    """Where a run's seconds went (summary.json); a field stays None until measured."""

    random_phase_s: float = 0.0  # collecting before the first update
    compile_warmup_s: float = 0.0  # compiling and warming the compiled code (the child's, in the background)
    eval_s: float = 0.0  # evaluations (and open-loop reports) since learning started
    first_update_s: float | None = None  # process start -> the first update done
    compile_background_s: float | None = None  # the background compile child's wall time
    compiled_from_update: int | None = None  # the first update on the compiled path
    compile_switch_s: float | None = None  # that update's seconds (dynamo traces again)
    compile_switch_cache_misses: int | None = None  # graphs it compiled again

    def to_dict(self) -> dict:
        """The measured ones."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass
class RunResult:
    """``finished_by``: see :class:`FinishedBy`; preempted leaves no final eval, no summary,
    and the throughput fields stay None."""

    finished_by: FinishedBy
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
    timers: Timers | None = None
    world_size: int | None = None  # data-parallel runs only
    max_param_divergence: float | None = None

    def __post_init__(self):
        self.finished_by = FinishedBy(self.finished_by)  # refuses anything else

    @property
    def preempted(self) -> bool:
        return self.finished_by is FinishedBy.PREEMPTED

    def to_dict(self) -> dict:
        """summary.json for a finished run; for a preempted one, what a requeue needs."""
        if self.preempted:
            return {"preempted": True, "run_dir": str(self.run_dir), "frames": self.frames,
                    "updates": self.updates, "stopped_by": self.stopped_by, "finished_by": self.finished_by.value}
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
            "finished_by": self.finished_by.value,
            **(self.timers.to_dict() if self.timers is not None else {}),
        }
