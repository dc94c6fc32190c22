"""Value and cross-field checks on a built Config; each failure is one line
(:class:`~dreamer.errors.UserError`) that names the key and what to change."""

from __future__ import annotations

from typing import Any, Optional

from dreamer.config.domains import violations
from dreamer.config.ratio import TrainRatio
from dreamer.config.schema import AlgoConfig, Config, DreamerV3Config
from dreamer.errors import UserError

# torch.compile modes that turn on CUDA graphs (torch._inductor.list_mode_options).
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def get_path(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_size_preset(model: Optional[str], algo_name: str) -> None:
    """model=NAME (conf/model/) sets DreamerV3 sizes; with another algorithm it is a mistake."""
    if model is not None and algo_name != "dreamer_v3":
        raise UserError(
            f"model={model} is a DreamerV3 size preset, but algo.name={algo_name}: "
            f"add algo=dreamer_v3 (or drop model= to keep {algo_name}'s own sizes)"
        )


def _check_algo(algo: AlgoConfig) -> None:
    if isinstance(algo, DreamerV3Config):
        if algo.rssm_hidden_dim % algo.gru_blocks:
            raise UserError(
                f"algo.rssm_hidden_dim={algo.rssm_hidden_dim} does not split into "
                f"algo.gru_blocks={algo.gru_blocks} equal blocks: pick a divisor (1 = one plain GRU)"
            )
        if algo.num_bins < 2 or algo.num_bins % 2 == 0:
            raise UserError(f"algo.num_bins={algo.num_bins} must be odd and >= 3, so one bin sits at 0")
        if algo.repval_grad and algo.replay_value_scale > 0 and not algo.joint_update:
            raise UserError(
                "algo.repval_grad=true trains the world model from the replay-value loss, which only the "
                "joint update can (Dreamer's order steps the world model first): set algo.joint_update=true "
                "or algo.repval_grad=false"
            )


def steps_before_learning(cfg: Config) -> int:
    """Agent steps the replay must hold before the first update (each rank fills its own replay,
    and its collector takes init_random_frames random steps over all its workers)."""
    return max(TrainRatio.of(cfg).replayed_per_update, cfg.collector.init_random_frames)


def _check_learning_can_start(cfg: Config) -> None:
    """The replay can hold what the first update needs, and the run lasts until then:
    otherwise the collector never stops (or the run ends having learned nothing)."""
    b, needed = cfg.buffer, steps_before_learning(cfg)
    sequences, random = TrainRatio.of(cfg).replayed_per_update, cfg.collector.init_random_frames
    need = (f"max(buffer.batch_size x buffer.batch_length = {sequences}, "
            f"collector.init_random_frames = {random}) = {needed} agent steps")
    lower = "collector.init_random_frames" if random > sequences else "buffer.batch_size x buffer.batch_length"
    if b.capacity < needed:
        raise UserError(
            f"buffer.capacity={b.capacity} cannot hold what the first update needs, {need}: "
            f"set buffer.capacity>={needed} (or lower {lower})"
        )
    frames = needed * cfg.env.action_repeat
    if cfg.train.total_frames < frames:
        raise UserError(
            f"train.total_frames={cfg.train.total_frames} ends before learning starts: the replay first needs {need}"
            f" = {frames} env frames (env.action_repeat={cfg.env.action_repeat}); set train.total_frames>={frames}"
            f" (or lower {lower})"
        )


def validate(cfg: Config) -> Config:
    """Cross-field checks; each failure is one line saying what to change."""
    # Every numeric key against the domain its schema field declares (dreamer.config.domains).
    for problem in violations(cfg):
        raise UserError(problem)
    _check_algo(cfg.algo)
    check_size_preset(cfg.model, cfg.algo.name)
    if cfg.compile.mode is not None and cfg.compile.options:
        raise UserError(
            f"compile.mode={cfg.compile.mode} and compile.options are both set; torch.compile "
            "accepts only one: add compile.options=null or compile.mode=null"
        )
    if cfg.compile.mode in CUDAGRAPH_MODES and not cfg.compile.cudagraphs:
        raise UserError(
            f"compile.mode={cfg.compile.mode} brings CUDA graphs, which the actor/value losses break (they "
            "update buffers in place and reuse outputs after backward): use compile.mode=max-autotune-no-cudagraphs, "
            "or add compile.cudagraphs=true to try them anyway"
        )
    if cfg.compile.update == "whole" and not cfg.compile.enabled:
        raise UserError(
            "compile.update=whole compiles the whole update, and compile.enabled=false compiles nothing: "
            "drop compile.enabled=false (compile=off), or use compile.update=losses for eager updates"
        )
    if cfg.collector.device.startswith("cuda"):
        raise UserError(
            f"collector.device={cfg.collector.device}: TorchRL hands CUDA weights to worker processes by "
            "reference, so workers would act with weights the learner is changing mid-update; use "
            "collector.device=cpu (the learner keeps the GPU)"
        )
    if not cfg.resume:  # a resumed run's learning started with its saved config (its end: dreamer.run.finished)
        _check_learning_can_start(cfg)
    if cfg.env.backend == "atari" and not cfg.env.from_pixels:
        raise UserError("env.backend=atari needs env.from_pixels=true (RAM states are not supported)")
    if cfg.env.noop_max and cfg.env.backend != "atari":
        raise UserError(
            f"env.noop_max={cfg.env.noop_max} is for Atari (no-op starts); set env.noop_max=0 "
            f"for env.backend={cfg.env.backend}"
        )
    if cfg.env.render_size < cfg.env.image_size and cfg.env.from_pixels:
        raise UserError(
            f"env.render_size={cfg.env.render_size} is smaller than env.image_size="
            f"{cfg.env.image_size}: store frames at least as large as the model input"
        )
    if cfg.env.from_pixels and cfg.env.image_size != 64:
        raise UserError(
            f"env.image_size={cfg.env.image_size}: the conv encoders/decoders are "
            "built for 64x64 frames; set env.image_size=64"
        )
    if cfg.profiling.last_update < cfg.profiling.first_update:
        raise UserError(
            f"profiling window {cfg.profiling.first_update}-{cfg.profiling.last_update} is empty: "
            "the last update must be >= the first (PROF_ITERATIONS=50-55)"
        )
    if not (cfg.device in ("auto", "cpu") or cfg.device.startswith("cuda")):
        raise UserError(f"device={cfg.device!r} is not allowed; choose auto, cpu, cuda or cuda:N")
    return cfg
