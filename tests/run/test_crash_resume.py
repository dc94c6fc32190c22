"""kill -9 at random moments (one of them mid-checkpoint-write), then resume: nothing lost, nothing repeated."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from dreamer.config import load_config
from dreamer.run import checkpoint as ckpt
from dreamer.run.build import build_run
from tests.support.processes import FAST, alive, descendants, read_metrics, start, wait_for

# checkpoint.every=20: a checkpoint every few collector batches; the replay
# buffer makes each one ~25 MB, so a write takes long enough to be caught.
CRASHY = (*FAST, "checkpoint.every=20", "checkpoint.keep=2", "checkpoint.replay=true")


def _kill(proc, when) -> None:
    """Wait for ``when()``, SIGKILL the main process, and check nothing it started outlives it."""
    children: list[int] = []
    listed_at = [-1.0]

    def ready() -> bool:
        # ``when`` is polled every 2 ms to catch a checkpoint mid-write; listing the process
        # tree (a scan of /proc) that often would keep a core busy: every 0.1 s is enough
        # for children that live for seconds.
        if time.monotonic() - listed_at[0] >= 0.1:
            children[:] = sorted(set(children) | set(descendants(proc.pid)))
            listed_at[0] = time.monotonic()
        return when()

    wait_for(ready, 180, "the kill point", poll=0.002)
    proc.kill()
    proc.communicate(timeout=30)
    wait_for(lambda: not alive(children), 30, f"orphaned processes {children} to exit")


def _writing_a_checkpoint(run_dir):
    checkpoints = run_dir / ckpt.CHECKPOINT_DIR
    return lambda: checkpoints.is_dir() and any(checkpoints.glob(".ckpt_*.tmp"))


def _after(seconds):
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


def _tensors_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_kill_9_at_random_moments_then_resume_is_exact(tmp_path):
    rng = random.Random(6)
    run_dir = tmp_path / "run"

    # 1: killed while the first checkpoint is being written (its temp file exists).
    _kill(start(*CRASHY, f"hydra.run.dir={run_dir}", "train.total_frames=100000"),
          _writing_a_checkpoint(run_dir))
    if not ckpt.list_checkpoints(run_dir):  # the very first write was cut: nothing to resume yet
        _kill(start(*CRASHY, f"hydra.run.dir={run_dir}", "train.total_frames=100000"),
              lambda: len(ckpt.list_checkpoints(run_dir)) >= 1 and _writing_a_checkpoint(run_dir)())

    # 2-3: resumed, then killed at a random moment (start-up, collection, update, checkpoint...).
    for _ in range(2):
        _kill(start(f"resume={run_dir}", "logger.progress_bar=false", f"hydra.run.dir={tmp_path / 'h'}"),
              _after(rng.uniform(4.0, 12.0)))

    # The newest complete checkpoint is what a resume restores, tensor for tensor.
    saved = ckpt.load_latest(run_dir)
    run = build_run(load_config({"resume": str(run_dir)}), run_dir)
    try:
        assert (run.counters.frames, run.counters.steps, run.counters.updates) == (
            saved["counters"]["frames"], saved["counters"]["steps"], saved["counters"]["updates"])
        assert _tensors_equal(run.learner.state_dict(), saved["learner"])  # weights and optimisers
        assert torch.equal(torch.get_rng_state(), saved["rng"]["torch"])
        numpy_state, saved_numpy = np.random.get_state(), saved["rng"]["numpy"]
        assert numpy_state[0] == saved_numpy["bit_generator"]
        assert np.array_equal(numpy_state[1], saved_numpy["keys"].numpy())
        assert numpy_state[2:] == (saved_numpy["pos"], saved_numpy["has_gauss"], saved_numpy["cached_gaussian"])
        assert random.getstate() == saved["rng"]["python"]
        replay, stored = run.replay.state_dict(), saved["replay"]
        n = stored["_storage"]["_len"]
        assert len(run.replay) == n > 0  # not silently empty
        for key, column in stored["_storage"]["_storage"].items():  # rows past _len were never written
            assert torch.equal(replay["_storage"]["_storage"][key][:n], column[:n]), key
        assert replay["_writer"] == stored["_writer"]  # the next write lands where it would have
    finally:
        run.close()

    # Finish the run: it continues from the checkpoint, and metrics never go backwards.
    target = saved["counters"]["frames"] + 50  # one more collector batch
    proc = start(f"resume={run_dir}", f"train.total_frames={target}", "logger.progress_bar=false",
                 f"hydra.run.dir={tmp_path / 'h'}")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    metrics = read_metrics(run_dir)
    for key in ("frames", "updates"):
        values = [m[key] for m in metrics]
        assert values == sorted(values), f"{key} went backwards in metrics.jsonl: {values}"
    assert metrics[-1]["frames"] >= target
