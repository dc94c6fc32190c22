"""`python -m dreamer [--check] [overrides]`: the entry point.

The command line is checked first, before Hydra creates anything (dreamer.check); ``--check``
stops there and prints what it found, a run goes on to Hydra and :func:`main`."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import hydra
from omegaconf import DictConfig

from dreamer.check import check_command_line, check_gl_environment, describe, overridden_keys
from dreamer.config import load_config, register_configs
from dreamer.config.location import conf_dir
from dreamer.errors import UserError
from dreamer.report.console import VERBOSE_ENV, quiet_logging
from dreamer.run.stopping import under_requeueing_scheduler
from dreamer.system.torch_version import warn_if_unsupported_torch

if TYPE_CHECKING:
    from dreamer.run.preflight import CheckedRun
    from dreamer.run.result import RunResult

register_configs()
log = logging.getLogger("dreamer")
CHECK_FLAG = "--check"


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


def main(dict_cfg: DictConfig, checked: CheckedRun | None = None) -> RunResult:
    """The Hydra task: one run. ``checked``: what the up-front checks found before Hydra
    started (a plain run, dreamer.check); a launcher's job (its own process, maybe its own
    machine) makes them here, in build_run, before it builds anything."""
    with one_line_on_user_error():
        check_gl_environment(os.environ)  # also for a launcher's job process, which skips run()
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
        if checked is not None:
            cfg, overridden = checked.cfg, set(checked.overridden)
        else:
            cfg = load_config(dict_cfg, environ=os.environ)
            task = list(HydraConfig.get().overrides.task)
            overridden = overridden_keys(task, dict_cfg, os.environ) if cfg.resume else set()
        from dreamer.run.trainer import train

        distributed.setup(cfg.distributed, cfg.device, ranks)
        try:
            result = train(cfg, Path(HydraConfig.get().runtime.output_dir), ranks, overridden, requeue=requeue,
                           quiet=not verbose, checked=checked)
        finally:
            distributed.teardown(ranks)
        state = "stopped early" if result.preempted else "done"
        summary = result.to_dict()
        log.info("%s: %s", state, {k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()})
        return result  # a launcher (hydra_plugins/dreamer_launcher) reads it


def hydra_entry(checked: CheckedRun | None) -> Callable[[], object]:
    """Hydra's entry point around :func:`main`, handing it ``checked`` (None: the job checks itself)."""
    def task(dict_cfg: DictConfig) -> RunResult:
        return main(dict_cfg, checked)

    return hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")(task)


def run() -> None:
    """``dreamer [--check] [--verbose] [-m] OVERRIDES`` (or Hydra's own flags: --help, --cfg job, ...)."""
    from dreamer.report.console import quiet_libraries, verbose_requested

    if verbose_requested(sys.argv, os.environ):  # --verbose is ours: removed before Hydra reads argv
        os.environ[VERBOSE_ENV] = "1"  # read by main(), also in a launcher's job process
    else:
        quiet_libraries(os.environ)
    dry_run = CHECK_FLAG in sys.argv
    argv = [arg for arg in sys.argv[1:] if arg != CHECK_FLAG]
    with one_line_on_user_error():
        command_line = check_command_line(argv, os.environ)  # before Hydra creates anything
        if dry_run and command_line is None:
            raise UserError(f"{CHECK_FLAG} checks a run's overrides (with -m, a sweep's): "
                            f"drop {' '.join(a for a in argv if a.startswith('-'))}")
    if dry_run:
        print(describe(command_line))
        return
    if command_line is None:  # --help, --cfg, ...: Hydra's own
        hydra_entry(None)()
        return
    sys.argv = [sys.argv[0], *command_line.hydra_argv]
    # One run: the job starts from what was checked. A sweep's jobs check themselves as they start.
    hydra_entry(None if command_line.multirun else command_line.jobs[0][1])()


if __name__ == "__main__":
    run()
