"""What a run is made of (:class:`Run`, built by ``dreamer.run.build.build_run``) and its checkpoint."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from tensordict.nn import TensorDictSequential
from torchrl.data import TensorDictReplayBuffer
from torchrl.envs import SerialEnv

from dreamer.algos.learner import BaseLearner
from dreamer.algos.policy import ModelSet
from dreamer.config import Config, to_dict
from dreamer.data.replay import load_replay_state, replay_state
from dreamer.data.supervisor import SupervisedCollector
from dreamer.report.logger import RunLogger
from dreamer.run import checkpoint as ckpt
from dreamer.run.cadence import Every, Ratio
from dreamer.run.result import Timers
from dreamer.run.stopping import Stopper
from dreamer.system import compile_cache
from dreamer.system.distributed import Ranks
from dreamer.system.profiling import TraceWindow

log = logging.getLogger("dreamer")


@dataclass
class Counters:
    frames: int = 0  # env frames (agent steps x action repeat)
    steps: int = 0  # agent steps stored
    updates: int = 0
    timers: Timers = field(default_factory=Timers)


def random_frames_left(init_random_frames: int, state: dict | None) -> int:
    """Random-action agent steps the collector still owes: all of them on a fresh run (``state``
    None), none once learning has started (the policy acts). A checkpoint written before the
    first update (a stop during the random prefill) owes the rest of the prefill: what its
    replay lacks when it holds the replay (checkpoint.replay), all of it again when it does not
    (the random steps it collected are gone)."""
    if state is None:
        return init_random_frames
    counters = state["counters"]
    if counters["updates"] > 0:
        return 0
    if "replay" in state:
        return max(0, init_random_frames - counters["steps"])
    return init_random_frames


@dataclass
class Cadence:
    """The loop's clocks: updates owed per collected step, and what is due every N updates."""

    ratio: Ratio
    sync_weights: Every
    log_due: Every
    eval_due: Every
    checkpoint_due: Every

    def state_dict(self) -> dict:
        return {f.name: getattr(self, f.name).state_dict() for f in fields(self)}

    def load_state_dict(self, state: dict) -> None:
        for name, sub in state.items():
            getattr(self, name).load_state_dict(sub)


@dataclass
class Run:
    """The collaborators of one training run. ``close()`` is the one teardown
    (progress bar, collector workers, trace window, eval env, logger, signal
    handlers), safe to call again; ``collection`` is its first part, closed as
    soon as the loop stops collecting."""

    cfg: Config
    run_dir: Path
    ranks: Ranks
    device: torch.device
    started: float  # time.perf_counter() at start: wall_s and train.max_minutes count from here
    stopper: Stopper
    models: ModelSet  # the algorithm's networks
    learner: BaseLearner
    replay: TensorDictReplayBuffer
    collector: SupervisedCollector
    eval_env: SerialEnv | None  # one env per evaluation episode (make_eval_env); None off rank 0
    eval_policy: TensorDictSequential  # models.policy(explore=False)
    cadence: Cadence
    logger: RunLogger
    trace_window: TraceWindow
    openloop: bool  # log open-loop imagination videos at each eval
    resumed: bool
    counters: Counters = field(default_factory=Counters)
    # sha256 of <run_dir>/compile_cache.bin as this run wrote (or loaded and checked) it;
    # the checkpoint records it so a resume loads only that file (dreamer.system.compile_cache).
    compile_artifact_sha256: str | None = None
    collection: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    teardown: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def close(self) -> None:
        self.teardown.close()

    # -- checkpoint -----------------------------------------------------------
    def state_dict(self) -> dict:
        n = self.counters
        return {
            "config": to_dict(self.cfg),
            "counters": {"frames": n.frames, "steps": n.steps, "updates": n.updates},
            "learner": self.learner.state_dict(),
            "cadence": self.cadence.state_dict(),
            "rng": ckpt.rng_state(),
            "logger": self.logger.state_dict(),  # the W&B run id and step registry (plain types)
            "compile_artifact_sha256": self.compile_artifact_sha256,
            **({"replay": replay_state(self.replay)} if self.cfg.checkpoint.replay else {}),
        }

    def restore(self, state: dict) -> None:
        c = state["counters"]
        self.counters.frames, self.counters.steps, self.counters.updates = c["frames"], c["steps"], c["updates"]
        self.learner.load_state_dict(state["learner"])
        self.cadence.load_state_dict(state["cadence"])
        ckpt.set_rng_state(state["rng"])
        if "replay" in state:
            load_replay_state(self.replay, state["replay"])
            log.info("replay buffer restored: %d steps", len(self.replay))
        else:
            log.info("replay buffer not in the checkpoint (checkpoint.replay=false): refilling it")
        # Its run id was used when the logger was built (build_run); here its counters.
        self.logger.load_state_dict(state.get("logger", {}))
        self.logger.rewind(c["updates"])  # records logged after this checkpoint are replayed anew
        log.info("checkpoint %s", state["path"])
        log.info("resumed from %s at frames=%d updates=%d", self.run_dir, c["frames"], c["updates"])

    def save_compile_artifact(self) -> None:
        """What this process compiled, to <run_dir>/compile_cache.bin; its digest goes into the next checkpoint."""
        digest = compile_cache.save_artifact(self.run_dir)
        if digest is not None:
            self.compile_artifact_sha256 = digest

    def save(self) -> Path | None:
        if not self.ranks.is_main:
            return None  # the weights are rank 0's
        return ckpt.save_checkpoint(self.run_dir, self.state_dict(), self.counters.updates, self.cfg.checkpoint.keep)
