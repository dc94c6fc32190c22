"""hydra_plugins/dreamer_launcher + conf/hydra/launcher/slurm.yaml: the cluster launchers."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import hydra
import pytest
from hydra.core.global_hydra import GlobalHydra

from dreamer.config import register_configs
from hydra_plugins.dreamer_launcher.requeue import RequeueingLocalLauncher
from tests.support.paths import CONF_DIR


def compose_hydra(overrides):
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra.compose("config", overrides=overrides, return_hydra_config=True).hydra.launcher
    finally:
        GlobalHydra.instance().clear()


def test_slurm_launcher_config_has_the_cluster_knobs_and_requeues():
    launcher = compose_hydra(["hydra/launcher=slurm", "hydra.launcher.partition=gpu"])
    assert launcher._target_ == "hydra_plugins.dreamer_launcher.requeue.RequeueingSlurmLauncher"
    assert launcher.partition == "gpu" and launcher.gpus_per_node == 1 and launcher.timeout_min > 0
    # Time to checkpoint before the limit, and requeues after time-outs allowed.
    assert launcher.signal_delay_s >= 60 and launcher.max_num_timeout > 0


def test_submitit_local_is_our_requeueing_launcher():
    launcher = compose_hydra(["hydra/launcher=submitit_local"])
    assert launcher._target_ == "hydra_plugins.dreamer_launcher.requeue.RequeueingLocalLauncher"


def test_the_requeued_job_resumes_the_run_directory():
    launcher = RequeueingLocalLauncher(submitit_folder="x")
    launcher._resume_from = "/runs/0"
    delayed = launcher.checkpoint(["seed=1", "resume=/old"], "hydra.sweep.dir", 0, "id", {})
    overrides = delayed.args[0]
    assert overrides == ["seed=1", "resume=/runs/0"]
    assert delayed.function is launcher


# -- the requeue path with fakes (no submitit job) -------------------------------------------

class _FakeJobResult:
    def __init__(self, value):
        from hydra.core.utils import JobStatus

        self.status, self._return_value = JobStatus.COMPLETED, value


def _launch(monkeypatch, returned, seen_env):
    """Run the launcher's __call__ with the job itself faked; returns (launcher, raised signals)."""
    import os

    from hydra_plugins.dreamer_launcher import requeue

    # Hydra's plugin scan may re-import the submitit launcher module: patch the base this class has.
    base = next(c for c in requeue.RequeueingLocalLauncher.__mro__ if c.__name__ == "BaseSubmititLauncher")

    def job(self, *args):
        seen_env.append(os.environ.get(requeue.REQUEUE_ENV))
        return _FakeJobResult(returned)

    monkeypatch.setattr(base, "__call__", job)
    raised = []
    monkeypatch.setattr(requeue.signal, "raise_signal", raised.append)
    monkeypatch.delenv(requeue.REQUEUE_ENV, raising=False)
    launcher = requeue.RequeueingLocalLauncher(submitit_folder="x")
    result = launcher(["seed=1"], "hydra.sweep.dir", 0, "id", {})
    assert result._return_value is returned
    assert requeue.REQUEUE_ENV not in os.environ  # put back as it was
    return launcher, raised


def test_a_preempted_run_sets_the_resume_dir_and_asks_submitit_to_requeue(monkeypatch, tmp_path):
    import submitit

    from dreamer.run.result import RunResult

    seen_env = []
    run = RunResult("preempted", tmp_path, 40, 30, stopped_by="SIGTERM")
    assert run.preempted
    launcher, raised = _launch(monkeypatch, run, seen_env)
    assert seen_env == ["1"]  # the run knew it was under a requeueing scheduler
    assert launcher._resume_from == str(tmp_path)
    assert raised == [submitit.JobEnvironment._usr_sig()]  # submitit's handler then checkpoints and requeues
    assert launcher.checkpoint(["seed=1"], "d", 0, "id", {}).args[0] == ["seed=1", f"resume={tmp_path}"]


def test_a_finished_run_is_not_requeued(monkeypatch, tmp_path):
    from dreamer.run.result import RunResult

    launcher, raised = _launch(monkeypatch, RunResult("total_frames", tmp_path, 600, 500), [])
    assert raised == [] and launcher._resume_from is None
    assert launcher.checkpoint(["seed=1"], "d", 0, "id", {}).args[0] == ["seed=1"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2])
def test_sigterm_and_sigusr2_under_the_launcher_end_the_run_preempted(monkeypatch, signum):
    """Preemption (SIGTERM) and the time-limit warning (SIGUSR2, submitit's own) both make the
    run checkpoint and return preempted, which is what makes the launcher requeue."""
    from dreamer.run.stopping import REQUEUE_ENV, Stopper, under_requeueing_scheduler

    monkeypatch.setenv(REQUEUE_ENV, "1")
    stopper = Stopper(requeue=under_requeueing_scheduler(os.environ)).install()
    try:
        os.kill(os.getpid(), signum)
        assert stopper.finished_by(stopper.poll()) == "preempted"
    finally:
        stopper.uninstall()


def _signal_handler(tmp_path, monkeypatch, *, timed_out: bool, countdown: int):
    """submitit's handler for the requeue signal, with our launcher as the job's function."""
    from submitit.core import job_environment, utils

    launcher = RequeueingLocalLauncher(submitit_folder=str(tmp_path))
    launcher._resume_from = "/runs/0"
    delayed = utils.DelayedSubmission(launcher, ["seed=1"], "hydra.sweep.dir", 0, "id", {})
    delayed.set_timeout(60, countdown)
    requeued = []
    env = SimpleNamespace(global_rank=0, _requeue=requeued.append)
    paths = SimpleNamespace(submitted_pickle=tmp_path / "submitted.pkl")
    handler = job_environment.SignalHandler(env, paths, delayed)
    monkeypatch.setattr(handler, "has_timed_out", lambda: timed_out)
    monkeypatch.setattr(handler, "_exit", lambda: requeued.append("exit"))
    return handler, requeued, paths.submitted_pickle


def test_a_time_out_requeues_resuming_while_max_num_timeout_allows(tmp_path, monkeypatch):
    from submitit.core import utils

    handler, requeued, pickle_path = _signal_handler(tmp_path, monkeypatch, timed_out=True, countdown=1)
    handler.checkpoint_and_try_requeue(signal.SIGUSR2)
    assert requeued == [0, "exit"]  # one time-out used up
    resubmitted = utils.DelayedSubmission.load(pickle_path)
    assert resubmitted.args[0] == ["seed=1", "resume=/runs/0"] and resubmitted._timeout_countdown == 0


def test_past_max_num_timeout_the_job_is_not_requeued(tmp_path, monkeypatch):
    from submitit.core import utils

    handler, requeued, _ = _signal_handler(tmp_path, monkeypatch, timed_out=True, countdown=0)
    with pytest.raises(utils.UncompletedJobError, match="timed-out too many times"):
        handler.checkpoint_and_try_requeue(signal.SIGUSR2)
    assert requeued == []


def test_a_preemption_requeues_whatever_the_time_outs_left(tmp_path, monkeypatch):
    handler, requeued, _ = _signal_handler(tmp_path, monkeypatch, timed_out=False, countdown=0)
    handler.checkpoint_and_try_requeue(signal.SIGTERM)
    assert requeued == [0, "exit"]
