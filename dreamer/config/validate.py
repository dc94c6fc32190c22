"""Value and cross-field checks on a built Config; each failure is one line
(:class:`~dreamer.errors.UserError`) that names the key and what to change."""

from __future__ import annotations

from typing import Any, Optional

from dreamer.config.schema import AlgoConfig, Config, DreamerV1Config, DreamerV3Config
from dreamer.errors import UserError

# Fields that must be > 0 (dotted paths); a zero batch or image size is a typo.
_POSITIVE = [
    "env.image_size", "env.render_size", "env.action_repeat", "env.max_episode_steps",
    "collector.frames_per_batch", "collector.weight_sync_every",
    "buffer.capacity", "buffer.batch_size", "buffer.batch_length",
    "logger.log_every", "eval.every", "eval.episodes", "eval.openloop_context",
    "eval.openloop_sequences", "checkpoint.every",
    "checkpoint.keep", "train.total_frames", "train.train_ratio", "train.stop_after_nonfinite",
    "profiling.first_update",
]
_NON_NEGATIVE = [
    "collector.init_random_frames", "buffer.prefetch", "compile.warmup_iters", "env.noop_max",
    "collector.max_restarts",
]

# The algo.* rules, by the class that has the field (a class's rules include its base's).
_ALGO_POSITIVE = {
    AlgoConfig: ["rssm_hidden_dim", "hidden_dim", "encoder_channels", "world_model_lr", "actor_lr",
                 "value_lr", "imagination_horizon", "reward_scale"],
    DreamerV1Config: ["state_dim", "grad_clip"],
    DreamerV3Config: ["num_categoricals", "num_classes", "num_bins", "mlp_layers", "gru_blocks",
                      "return_norm_min_scale"],
}
_ALGO_NON_NEGATIVE = {
    DreamerV1Config: ["free_nats", "exploration_noise"],
    DreamerV3Config: ["unimix", "free_bits", "dyn_loss_scale", "rep_loss_scale", "entropy_scale",
                      "slow_critic_reg", "agc", "lr_warmup_steps", "replay_value_scale"],
}
_ALGO_EMA_RATES = {DreamerV3Config: ["slow_critic_tau", "return_norm_rate"]}
# Fractions that must lie in [low, high).
_ALGO_FRACTIONS = {DreamerV1Config: {"slow_value_tau": (0.0, 1.0)}, DreamerV3Config: {"unimix": (0.0, 1.0)}}


# torch.compile modes that turn on CUDA graphs (torch._inductor.list_mode_options).
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")

def _algo_paths(table: dict, algo: AlgoConfig) -> list[str]:
    """The dotted algo.* paths ``table`` lists for ``algo``'s class and its bases (base first)."""
    return ["algo." + name for cls in reversed(type(algo).__mro__) for name in table.get(cls, ())]


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


def validate(cfg: Config) -> Config:
    """Cross-field checks; each failure is one line saying what to change."""
    for path in _POSITIVE + _algo_paths(_ALGO_POSITIVE, cfg.algo):
        if get_path(cfg, path) <= 0:
            raise UserError(f"{path}={get_path(cfg, path)} must be > 0")
    for path in _NON_NEGATIVE + _algo_paths(_ALGO_NON_NEGATIVE, cfg.algo):
        if get_path(cfg, path) < 0:
            raise UserError(f"{path}={get_path(cfg, path)} must be >= 0")
    for cls in type(cfg.algo).__mro__:
        for name, (low, high) in _ALGO_FRACTIONS.get(cls, {}).items():
            if not low <= getattr(cfg.algo, name) < high:
                raise UserError(f"algo.{name}={getattr(cfg.algo, name)} must be in [{low}, {high})")
    for path in _algo_paths(_ALGO_EMA_RATES, cfg.algo):
        if not 0.0 < get_path(cfg, path) <= 1.0:
            raise UserError(f"{path}={get_path(cfg, path)} is an EMA rate: it must be in (0, 1]")
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
            "drop compile.enabled=false (compile=off), or use compile.update=card for eager updates"
        )
    if cfg.collector.device.startswith("cuda"):
        raise UserError(
            f"collector.device={cfg.collector.device}: TorchRL hands CUDA weights to worker processes by "
            "reference, so workers would act with weights the learner is changing mid-update; use "
            "collector.device=cpu (the learner keeps the GPU)"
        )
    if cfg.train.max_minutes is not None and cfg.train.max_minutes <= 0:
        raise UserError(f"train.max_minutes={cfg.train.max_minutes} must be > 0 (or null for no limit)")
    if cfg.threads is not None and cfg.threads <= 0:
        raise UserError(f"threads={cfg.threads} must be > 0 (or null for automatic)")
    if cfg.collector.num_workers is not None and cfg.collector.num_workers < 0:
        raise UserError(f"collector.num_workers={cfg.collector.num_workers} must be >= 0")
    if cfg.buffer.batch_length > cfg.env.max_episode_steps:
        raise UserError(
            f"buffer.batch_length={cfg.buffer.batch_length} is longer than "
            f"env.max_episode_steps={cfg.env.max_episode_steps}: shorten the sequences"
        )
    if cfg.buffer.batch_length > cfg.buffer.capacity:
        raise UserError("buffer.capacity must hold at least one sequence (batch_length steps)")
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
