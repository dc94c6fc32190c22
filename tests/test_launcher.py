"""hydra_plugins/dreamer_launcher + conf/hydra/launcher/slurm.yaml: the cluster launchers."""

from __future__ import annotations

import hydra
from helpers_unit import CONF_DIR
from hydra.core.global_hydra import GlobalHydra

from dreamer.config import register_configs
from hydra_plugins.dreamer_launcher.requeue import RequeueingLocalLauncher


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
