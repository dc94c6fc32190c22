"""`python -m dreamer [overrides]`: the Hydra entry point."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from dreamer.config import load_config, register_configs
from dreamer.config.environ import profiling_from_env
from dreamer.config.location import conf_dir
from dreamer.envs.rendering import missing_gl_library
from dreamer.errors import UserError
from dreamer.report.console import VERBOSE_ENV, quiet_logging
from dreamer.run.stopping import under_requeueing_scheduler
from dreamer.system.torch_version import warn_if_unsupported_torch

if TYPE_CHECKING:
    from dreamer.run.result import RunResult

register_configs()
log = logging.getLogger("dreamer")


def check_gl_before_torchrl(environ=os.environ) -> None:
    """An explicit MUJOCO_GL whose library is missing fails as soon as torchrl is imported, whatever
    the env: ``torchrl.envs`` looks for ``mujoco.mjx``, which imports mujoco's renderer, which
    loads PyOpenGL for that backend ('NoneType' object has no attribute 'glGetError'). So it is
    checked before torchrl is imported, for every run."""
    if problem := missing_gl_library(environ):
        raise UserError(problem)


@contextlib.contextmanager
def one_line_on_user_error():
    """A mistake the user can fix ends as one ``error:`` line and exit 2 (the full
    traceback with HYDRA_FULL_ERROR=1)."""
    try:
        yield
    except UserError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def overridden_keys(dict_cfg: DictConfig, environ=os.environ) -> set[str]:
    """Dotted config keys this command line changes, named directly or through a
    group (``experiment=smoke`` changes every key the preset sets), and the
    profiling keys its PROF_* environment variables set (they win over the config)."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from dreamer.run.resume import differing_keys

    task = list(HydraConfig.get().overrides.task)
    named = {o.split("=", 1)[0].lstrip("+~") for o in task}
    baseline = OmegaConf.to_container(compose(config_name="config"), resolve=True)
    current = OmegaConf.to_container(dict_cfg, resolve=True)
    baseline.pop("hydra", None)
    current.pop("hydra", None)
    from_env = {f"profiling.{key}" for key in profiling_from_env(environ)}
    return named | set(differing_keys(baseline, current)) | from_env


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def main(dict_cfg: DictConfig) -> RunResult:
    with one_line_on_user_error():
        check_gl_before_torchrl()  # also for a launcher's job process, which skips run()
    warn_if_unsupported_torch()  # one line when torch is outside pyproject.toml's range
    verbose = os.environ.get(VERBOSE_ENV) == "1"
    if not verbose:
        quiet_logging()  # Hydra has configured logging for the job by now; before torchrl logs (PyOpenGL)
    # torch is imported here, not at the top: --cfg and a bad input's one line come back
    # without paying for it.
    import torch.multiprocessing as mp
    from hydra.core.hydra_config import HydraConfig

    from dreamer.system import distributed
    from torchrl_ext.tensordict_fast_path import install_from_any_fast_path

    # Module outputs skip tensordict's per-call package search (torchrl_ext/tensordict_fast_path.py);
    # here rather than on import, so only the processes that train are patched (workers: make_collector).
    install_from_any_fast_path()
    # Workers must start clean: spawn, never fork (fork would copy any
    # compiler / CUDA state the parent has).
    mp.set_start_method("spawn", force=True)
    # A SLURM job (scripts/sbatch_dreamer.sh) or the requeueing launcher: a stop
    # signal (--signal=...@seconds before the time limit, or preemption)
    # checkpoints and exits 0, and the scheduler requeues the run.
    requeue = under_requeueing_scheduler(os.environ)
    distributed.export_scheduler_ranks(os.environ)  # a multi-task submitit job: one data-parallel run
    ranks = distributed.ranks_from_env(os.environ)  # torchrun's (or exported above), else one process
    with one_line_on_user_error():
        cfg = load_config(dict_cfg, environ=os.environ)
        from dreamer.run.trainer import train

        distributed.setup(cfg.distributed, cfg.device, ranks)
        try:
            overridden = overridden_keys(dict_cfg) if cfg.resume else set()
            result = train(cfg, Path(HydraConfig.get().runtime.output_dir), ranks, overridden, requeue=requeue,
                           quiet=not verbose)
        finally:
            distributed.teardown(ranks)
        state = "stopped early" if result.preempted else "done"
        summary = result.to_dict()
        log.info("%s: %s", state, {k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()})
        return result  # a launcher (hydra_plugins/dreamer_launcher) reads it


def run() -> None:
    from dreamer.config.preflight import check_command_line
    from dreamer.report.console import quiet_libraries, verbose_requested

    if verbose_requested(sys.argv, os.environ):  # --verbose is ours: removed before Hydra reads argv
        os.environ[VERBOSE_ENV] = "1"  # read by main(), also in a launcher's job process
    else:
        quiet_libraries(os.environ)
    with one_line_on_user_error():
        check_gl_before_torchrl()
        check_command_line(sys.argv[1:])
    main()


if __name__ == "__main__":
    run()
