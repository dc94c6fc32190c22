"""The command line's up-front checks: what ``dreamer --check OVERRIDES`` runs, and what
``dreamer OVERRIDES`` runs before Hydra creates anything.

:func:`check_command_line` composes the overrides as Hydra will (dreamer.config.compose),
builds the config (dreamer.config.load), probes the run directories' locks and runs the
run's own checks (dreamer.run.preflight.check_run), for each job of a ``-m`` sweep. The
dry run prints what it found; the run hands it to the job and starts Hydra. So a refused
command line is the same one ``error:`` line (exit 2) either way, and leaves nothing on
disk: no run directory, ``.hydra/``, log, lock or ``multirun.yaml``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from dreamer.config import load_config, profiling_from_env, to_dict
from dreamer.config.compose import compose_overrides, compose_with_settings, sweep_jobs
from dreamer.envs.rendering import gl_environment_problem
from dreamer.errors import UserError
from dreamer.run.lock import refuse_if_held

if TYPE_CHECKING:  # imported where used: a bad key's one line (and --help) come back without torch
    from dreamer.run.preflight import CheckedRun

MULTIRUN_FLAGS = ("-m", "--multirun")
# Hydra's launcher that runs a sweep's jobs in this process, one after another: its jobs
# are checked here in full. Any other may run them elsewhere (SLURM), so each job checks
# what depends on its machine itself.
IN_PROCESS_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


@dataclasses.dataclass(frozen=True)
class CheckedCommandLine:
    """A command line every check passed: what Hydra is to be given, and each job's findings."""

    hydra_argv: list[str]  # the arguments for Hydra (a resume's own directory added)
    jobs: list[tuple[list[str], CheckedRun]]  # (its overrides, what its checks found), one per job
    multirun: bool


def check_gl_environment(environ: Mapping[str, str]) -> None:
    """MUJOCO_GL, checked before torchrl is imported: its import imports mujoco, which fails
    on a backend it refuses or whose library is missing, whatever the env (dreamer.envs.rendering)."""
    if problem := gl_environment_problem(environ):
        raise UserError(problem)


def check_command_line(argv: list[str], environ: Mapping[str, str] = os.environ, *,
                       this_machine: bool = True) -> CheckedCommandLine | None:
    """Every check ``dreamer ARGV`` makes before it creates anything; None for Hydra's flags
    that start no run or read another config (``--help``, ``--cfg``, ``--info``, ``-cn``, ...),
    which go to Hydra unchecked. ``this_machine=False`` leaves out what depends on the
    machine the run trains on (dreamer.run.preflight.check_run)."""
    multirun = any(arg in MULTIRUN_FLAGS for arg in argv)
    overrides = [arg for arg in argv if arg not in MULTIRUN_FLAGS]
    if any(arg.startswith("-") for arg in overrides):
        return None
    check_gl_environment(environ)
    jobs = sweep_jobs(overrides) if multirun else [overrides]
    first, settings = compose_with_settings(jobs[0])  # Hydra's own keys: one line for a mistake there too
    # Every job's config first: a mistake in any is found before anything is built.
    configs = [first] + [compose_overrides(job) for job in jobs[1:]]
    for dict_cfg in configs[1:]:
        load_config(dict_cfg, environ=environ)
    if multirun:
        from dreamer.run.preflight import check_dir_can_be_written

        check_dir_can_be_written(Path(settings.sweep.dir), "hydra.sweep.dir")
        here = this_machine and settings.launcher._target_ == IN_PROCESS_LAUNCHER
        return CheckedCommandLine(list(argv), [(job, _check_job(job, dict_cfg, None, environ, here))
                                               for job, dict_cfg in zip(jobs, configs)], multirun=True)
    run_dir = Path(settings.run.dir)
    checked = _check_job(overrides, first, run_dir, environ, this_machine)
    return CheckedCommandLine(_hydra_argv(argv, overrides, checked, run_dir), [(overrides, checked)], multirun=False)


def _check_job(overrides: list[str], dict_cfg, run_dir: Path | None, environ: Mapping[str, str],
               this_machine: bool) -> CheckedRun:
    """One job (``dict_cfg``: its composed config): its config built and validated, the
    directories it writes not held by a live run, and the run's checks (``run_dir``: Hydra's
    directory for it, None: a sweep's job)."""
    cfg = load_config(dict_cfg, environ=environ)
    from dreamer.run.preflight import check_dir_can_be_written, check_run
    from dreamer.system import distributed

    if cfg.resume:
        refuse_if_held(Path(cfg.resume), "resume")
    if run_dir is not None:
        refuse_if_held(run_dir, "hydra.run.dir")  # before Hydra writes .hydra/ and its log there
        if cfg.resume and _given(overrides, "hydra.run.dir"):
            check_dir_can_be_written(run_dir, "hydra.run.dir")  # Hydra's own files go there
    overridden = overridden_keys(overrides, dict_cfg, environ) if cfg.resume else set()
    return check_run(cfg, overridden, run_dir=run_dir, ranks=distributed.ranks_from_env(environ),
                     this_machine=this_machine)


def _given(overrides: list[str], key: str) -> bool:
    return any(o.lstrip("+").partition("=")[0] == key for o in overrides)


def _hydra_argv(argv: list[str], overrides: list[str], checked: CheckedRun, run_dir: Path) -> list[str]:
    """``argv`` for Hydra. A resume writes only into the run it resumes: Hydra's directory
    is that run's (unless hydra.run.dir is given), and Hydra keeps the .hydra/ record of
    how the run was started (no output subdir)."""
    if checked.resumed_state is None or _given(overrides, "hydra.run.dir"):
        return list(argv)
    extra = [f"hydra.run.dir={_quoted(checked.run_dir)}"]
    if not _given(overrides, "hydra.output_subdir"):
        extra.append("hydra.output_subdir=null")
    return [*argv, *extra]


def _quoted(path: Path) -> str:
    """A path as one quoted Hydra override value: its quotes escaped, and the backslashes before
    a quote or the closing one doubled (Hydra reads other backslashes as they are)."""
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", str(path))
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text) + "'"


def overridden_keys(overrides: list[str], dict_cfg, environ: Mapping[str, str] = os.environ) -> set[str]:
    """Dotted config keys this command line changes, named directly or through a group
    (``experiment=smoke`` changes every key the preset sets), and the profiling keys its
    PROF_* environment variables set (they win over the config)."""
    from omegaconf import OmegaConf

    from dreamer.run.resume import differing_keys

    named = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    baseline = OmegaConf.to_container(compose_overrides([]), resolve=True)
    current = OmegaConf.to_container(dict_cfg, resolve=True)
    baseline.pop("hydra", None)
    current.pop("hydra", None)
    from_env = {f"profiling.{key}" for key in profiling_from_env(environ)}
    return named | set(differing_keys(baseline, current)) | from_env


def describe(command_line: CheckedCommandLine) -> str:
    """What ``--check`` prints: each job's findings as YAML comments, then the config it
    trains with (a resume: the saved config with the allowed overrides) as YAML."""
    from omegaconf import OmegaConf

    parts = []
    for index, (overrides, checked) in enumerate(command_line.jobs):
        lines = [f"# job {index}: {' '.join(overrides) or '(no overrides)'}"] if command_line.multirun else []
        lines += [f"# {line}" for line in findings(checked)]
        parts.append("\n".join(lines) + "\n" + OmegaConf.to_yaml(to_dict(checked.cfg)))
    return "\n".join(parts)


def findings(checked: CheckedRun) -> list[str]:
    """One line each: what the run writes into, and what was checked on this machine (or not)."""
    cfg = checked.cfg
    if checked.resumed_state is not None:
        where = f"resumes {checked.run_dir} from {Path(checked.resumed_state['path']).name}"
        where += "".join(f"; would move aside unreadable {Path(p).name} ({why})"
                         for p, why in checked.resumed_state.get("unreadable", ()))
    else:
        where = f"writes into {checked.run_dir}" if checked.run_dir is not None else "writes into its sweep's directory"
    lines = [f"checked, nothing refused: the run {where}"]
    if checked.device is None:
        lines.append("not checked here: the device, the env, memory and disk of the machine the job runs on "
                     "(the job checks them before it builds)")
    else:
        gib = cfg.buffer.capacity * checked.step_bytes / 2**30
        lines.append(f"this machine: learns on {checked.device}; replay {cfg.buffer.capacity} steps x "
                     f"{checked.step_bytes} bytes = {gib:.2f} GiB of host memory")
    return lines

