"""Every check a run makes before it creates anything, in one call: :func:`check_run`.

``dreamer --check`` runs it and stops; a run runs it before Hydra creates its
directory (dreamer.check), or, where a launcher started the job, in the job before
it builds anything (dreamer.run.build). Each check is a function of the part it
protects (the replay's memory in dreamer.data.replay, the open-loop video's context
in dreamer.report.openloop, a resume's checkpoint in dreamer.run.resume, ...): this
module calls them in the order the run meets them and writes nothing. The one env it
builds (for the sizes of a step) is closed again; no worker is spawned.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import tempfile
from pathlib import Path

import torch

from dreamer.algos.registry import algorithm
from dreamer.algos.update_paths import resolve_update_path
from dreamer.config import Config
from dreamer.data.replay import bytes_per_step, check_capacity, use_pinned_memory
from dreamer.envs.factory import close_env, is_discrete, make_env
from dreamer.envs.keys import observation_key
from dreamer.errors import UserError
from dreamer.report.logger import check_video_writer
from dreamer.report.openloop import check_openloop_config, openloop_enabled
from dreamer.run import checkpoint as ckpt
from dreamer.run import resume
from dreamer.run.finished import refuse_finished_run
from dreamer.system import distributed
from dreamer.system.compile_cache import check_given_artifact
from dreamer.system.device import resolve_device


@dataclasses.dataclass(frozen=True)
class CheckedRun:
    """What the checks found, and what the run starts from."""

    cfg: Config  # what it trains with: a resumed run's saved config, with the allowed overrides
    overridden: frozenset[str]  # config keys the command line set
    run_dir: Path | None  # where it writes: the resumed run, or hydra.run.dir (None: not known yet)
    resumed_state: dict | None  # the checkpoint it resumes from (read, not yet restored)
    device: torch.device | None = None  # where it learns; None: this machine was not checked
    step_bytes: int | None = None  # one replayed step's bytes (this machine's checks measure it)


def check_run(cfg: Config, overridden: set[str] | frozenset[str] = frozenset(), *, run_dir: Path | None = None,
              ranks: distributed.Ranks = distributed.Ranks(), this_machine: bool = True) -> CheckedRun:
    """Refuse, in one line (:class:`~dreamer.errors.UserError`), what the run would refuse.

    ``run_dir``: where a fresh run writes (hydra.run.dir; None where it is not known
    yet, a multirun's job); a resume writes into ``cfg.resume``. ``this_machine=False``
    leaves out what depends on the machine the run will train on (its device, the env
    it builds with this machine's rendering and packages, memory and disk): for jobs a
    launcher runs elsewhere, and for commands shown in the docs.
    """
    cfg, run_dir, state = _check_run_files(cfg, overridden, run_dir)
    check_openloop_config(cfg.eval, cfg.env, cfg.buffer.batch_length)
    if state is None or resume.given_on_command_line("compile.cache_artifact", set(overridden)):
        check_given_artifact(cfg.compile)  # a resumed run's saved one may be gone: a warning then
    check_video_writer(ranks.is_main and (cfg.eval.video or openloop_enabled(cfg.eval, cfg.env)))
    checked = CheckedRun(cfg, frozenset(overridden), run_dir, state)
    return _check_this_machine(checked, ranks) if this_machine else checked


def _check_run_files(cfg: Config, overridden, run_dir: Path | None) -> tuple[Config, Path | None, dict | None]:
    """A resume: its directory, checkpoint and overrides (and the config it continues
    with); a fresh run: a directory it can create, that holds no run to resume."""
    if cfg.resume:
        resumed_dir, cfg, state = resume.open_run(cfg, set(overridden))
        refuse_finished_run(resumed_dir, cfg, state)
        return cfg, resumed_dir, state
    if run_dir is not None:
        check_dir_can_be_written(Path(run_dir), "hydra.run.dir")
        resume.refuse_run_dir_with_checkpoints(Path(run_dir))
    return cfg, run_dir, None


def _check_this_machine(checked: CheckedRun, ranks: distributed.Ranks) -> CheckedRun:
    """The device, the env (this machine's rendering and packages), host memory for the
    replay and, with checkpoint.replay, disk for its checkpoints."""
    cfg = checked.cfg
    device = distributed.rank_device(resolve_device(cfg.device), ranks)
    resolve_update_path(cfg.compile, device)
    use_pinned_memory(cfg.buffer, device)
    measure_models = cfg.checkpoint.replay and ranks.is_main
    step_bytes, model_bytes = measure_env_and_models(cfg, measure_models)
    replay_bytes = check_capacity(cfg.buffer, step_bytes, ranks_per_node=ranks.local_world_size)
    if measure_models:
        where = nearest_existing(checked.run_dir if checked.run_dir is not None else Path.cwd())
        ckpt.check_replay_checkpoint_space(where, replay_bytes, model_bytes, cfg.checkpoint.keep)
    return dataclasses.replace(checked, device=device, step_bytes=step_bytes)


def measure_env_and_models(cfg: Config, with_models: bool) -> tuple[int, int]:
    """(bytes of one replayed step, about what the models add to a checkpoint: 0 unless
    ``with_models``), from one env built here (a bad env name, a missing extra, an env.import
    that fails or actions the algorithm cannot learn is one line) and, with ``with_models``,
    the learner built on the CPU."""
    env = make_env(cfg.env, cfg.algo, seed=cfg.seed)
    try:
        build_models, learner_cls = algorithm(cfg.algo.name)
        learner_cls.refuse_env(cfg.algo, is_discrete(env))
        step_bytes = bytes_per_step(env.fake_tensordict(), observation_key(cfg.env))
        if not with_models:
            return step_bytes, 0
        cpu = torch.device("cpu")
        models = build_models(cfg.algo, cfg.env, env, cpu)
        # The update path does not change what is saved; captured needs CUDA, this copy is on the CPU.
        learner = learner_cls(cfg.algo, dataclasses.replace(cfg.compile, update="losses"), models, cpu,
                              batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length,
                              autocast_dtype=None)
        return step_bytes, model_checkpoint_bytes(learner, models)
    finally:
        close_env(env)


def model_checkpoint_bytes(learner, models) -> int:
    """About what the learner adds to a checkpoint: its state now, plus two Adam moments
    per parameter (the optimisers allocate them at their first step)."""
    parameter_bytes = sum(p.numel() * p.element_size() for p in models.modules.parameters())
    return ckpt.state_bytes(learner.state_dict()) + 2 * parameter_bytes


def nearest_existing(path: Path) -> Path:
    """``path``, or the nearest directory above it that exists."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_dir_can_be_written(run_dir: Path, what: str) -> None:
    """``what=run_dir`` names a directory this process can create and write into: tried
    in the nearest directory that exists, with a file that vanishes again (nothing made)."""
    existing = nearest_existing(run_dir)
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise UserError(
            f"{what}={run_dir} cannot be written ({err.strerror or err}); choose a writable directory"
        ) from None
