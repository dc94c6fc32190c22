"""A stop during the random prefill, then a resume: the collector takes the rest of the prefill
with random actions (issue 45 item 6). build_run with the real collaborators, in-process."""

from __future__ import annotations

import dataclasses

import pytest
import torch

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
        assert len(resumed.replay) == (31 if replay_saved else 0)  # 30 steps and the episode's reset record
        assert resumed.collector.collector.init_random_frames == random_left  # was 0: the untrained policy acted
    finally:
        resumed.close()


def test_a_collector_rebuilt_during_the_prefill_takes_only_the_random_steps_still_owed(monkeypatch):
    """A worker that dies during the random prefill: the rebuilt collector owes the rest of the
    prefill, not none of it (the untrained policy would act) and not all of it again."""
    from dreamer.run import build
    from dreamer.system import distributed

    asked = []

    class Collector:
        def __init__(self, random_frames):
            asked.append(random_frames)

        def __iter__(self):
            raise AssertionError("not iterated here")

    monkeypatch.setattr(build, "make_collector", lambda *a, random_frames, **k: Collector(random_frames))
    monkeypatch.setattr(build, "worker_policy", lambda acting, device, collector_device: (acting,))
    cfg = tiny_config()
    trace_window = type("Window", (), {"collector_hook": lambda self: None})()
    supervised = build._start_collector(
        cfg, distributed.Ranks(), stopper=type("S", (), {"requested": None})(), acting=None,
        device=torch.device("cpu"), placement=build._Placement(workers=1, threads=1), trace_window=trace_window,
        random_frames=500, quiet=True,
    )
    supervised.collected = 120  # the first collector delivered 120 agent steps, then a worker died
    supervised.build(supervised.collected)
    supervised.build(900)  # past the prefill: the policy acts
    assert asked == [500, 380, 0]
