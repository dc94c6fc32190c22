"""A stop during the random prefill, then a resume: the collector takes the rest of the prefill
with random actions (issue 45 item 6). build_run with the real collaborators, in-process."""

from __future__ import annotations

import dataclasses

import pytest

from dreamer.data.replay import write
from dreamer.run.build import build_run
from tests.support.configs import tiny_config


def _prefill_stopped_after(steps_wanted: int, run_dir, replay_saved: bool):
    """A run that collected ``steps_wanted`` random steps (in 10-step batches) and checkpointed, as
    a stop during the prefill leaves it; returns its config."""
    cfg = tiny_config()
    cfg.eval.video = False
    cfg.collector.frames_per_batch = 10
    cfg.checkpoint.replay = replay_saved
    run = build_run(cfg, run_dir)
    try:
        for batch in run.collector:
            run.counters.steps += write(run.replay, batch, run.models.obs_key)
            if run.counters.steps >= steps_wanted:
                break
        run.counters.frames = run.counters.steps * cfg.env.action_repeat
        run.save()
    finally:
        run.close()
    return cfg


@pytest.mark.parametrize("replay_saved, random_left", [(False, 100), (True, 70)],
                         ids=["replay not saved: all of it again", "replay saved: the rest"])
def test_a_run_stopped_during_the_prefill_resumes_with_the_random_steps_it_lacks(tmp_path, replay_saved, random_left):
    cfg = _prefill_stopped_after(30, tmp_path, replay_saved)
    resumed = build_run(dataclasses.replace(cfg, resume=str(tmp_path)), tmp_path / "hydra")
    try:
        assert resumed.counters.steps == 30 and resumed.counters.updates == 0
        assert len(resumed.replay) == (30 if replay_saved else 0)
        assert resumed.collector.collector.init_random_frames == random_left  # was 0: the untrained policy acted
    finally:
        resumed.close()
