"""Typed, validated configuration: the one source of truth for a run.

The dataclasses below are the schema. Hydra composes YAML from ``conf/`` on top
of them (YAML only overrides), then :func:`load_config` turns the composed
``DictConfig`` into these dataclasses and validates every value, raising
:class:`~dreamer.errors.UserError` with one line that names the key and the
allowed values.

OmegaConf does not understand ``Literal[...]`` annotations, so the schema
registered in Hydra's ConfigStore is a mirror of these classes with each
``Literal`` replaced by ``str`` (:func:`omegaconf_schema`); the choices are
checked here instead, with better messages than OmegaConf would give.
"""

from __future__ import annotations

import copy
import dataclasses
import keyword
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union, get_args, get_origin

from dreamer.errors import UserError


@dataclass
class EnvConfig:
    # gymnasium: any registered id (e.g. Pendulum-v1); dm_control: "domain-task"
    # (e.g. cheetah-run); atari: the ALE game name (e.g. Pong).
    backend: Literal["gymnasium", "dm_control", "atari"] = "gymnasium"
    name: str = "Pendulum-v1"
    from_pixels: bool = False
    # Size the model sees (learner-side resize target, square).
    image_size: int = 64
    # Size frames are stored at (uint8). DMC renders at this size directly;
    # gymnasium/Atari frames are downsampled to it in the worker (uint8 in,
    # uint8 out) so a 500x500 render never reaches the replay buffer.
    render_size: int = 64
    grayscale: bool = False
    action_repeat: int = 2
    # Episode limit in agent steps (after action repeat).
    max_episode_steps: int = 500
    # Atari only: probability of repeating the previous action (ALE v5 default).
    sticky_action_prob: float = 0.25
    # Atari only: no-op starts. After each reset a random number of emulator
    # frames in [0, noop_max] pass with the NOOP action (raw frames, not agent
    # steps, as in DQN's and DreamerV3's protocol: 30); 0 = off.
    noop_max: int = 0
    # A Python module imported (in the main process and in every collector
    # worker) before the env is looked up, so ids it registers with
    # gymnasium.register exist: env.import=mypkg.envs. YAML and the command
    # line call it `import`; a keyword cannot name a Python field (KEYWORD_KEYS).
    import_: Optional[str] = None


@dataclass
class AlgoConfig:
    name: Literal["dreamer_v1", "dreamer_v3"] = "dreamer_v1"
    # V1's Gaussian latent size; V3's latent is num_categoricals x num_classes
    # (see latent_state_dim).
    state_dim: int = 30
    rssm_hidden_dim: int = 200
    hidden_dim: int = 400
    encoder_channels: int = 32
    activation: Literal["elu", "relu", "silu", "tanh"] = "elu"
    world_model_lr: float = 6e-4
    actor_lr: float = 8e-5
    value_lr: float = 8e-5
    adam_eps: float = 1e-7
    grad_clip: float = 100.0
    kl_scale: float = 1.0
    free_nats: float = 3.0
    gamma: float = 0.99
    lmbda: float = 0.95
    imagination_horizon: int = 15
    exploration_noise: float = 0.3
    # Rewards the learner sees are multiplied by this (reported returns are not).
    # Dreamer's learning rates assume O(1) rewards, as in DMC; Pendulum's reach -16.
    reward_scale: float = 1.0

    # -- Dreamer V3 only (Hafner et al., 2023; paper defaults). V3 reuses the
    # sizes, learning rates, adam_eps (its optimiser's epsilon), gamma, lmbda
    # and imagination_horizon above; conf/algo/dreamer_v3.yaml sets their V3 values.
    # Categorical latent: num_categoricals one-hot vectors of num_classes each.
    num_categoricals: int = 32
    num_classes: int = 32
    # Mix of the uniform distribution into every categorical (latents, discrete actions).
    unimix: float = 0.01
    # KL below this many nats (per step) is not penalised.
    free_bits: float = 1.0
    # World-model loss weights: prediction (recon/reward/continue) is 1.
    dyn_loss_scale: float = 0.5
    rep_loss_scale: float = 0.1
    # Reward and value heads: two-hot over this many symexp-spaced bins.
    num_bins: int = 255
    # The RSSM's recurrent core as gru_blocks block-diagonal GRUs (the paper's 8:
    # rssm_hidden_dim / 8 units each, an eighth of a full GRU's weights); 1 = one plain GRU.
    gru_blocks: int = 8
    # Hidden layers of every V3 MLP (encoder, decoder, heads, actor, value).
    mlp_layers: int = 2
    # Actor entropy bonus and return normalisation (5th-95th percentile range,
    # an EMA with this rate, never dividing by less than min_scale).
    entropy_scale: float = 3.0e-4
    return_norm_rate: float = 0.01
    return_norm_min_scale: float = 1.0
    # Slow critic: EMA of the value weights (tau per update) that regularises it.
    slow_critic_tau: float = 0.02
    slow_critic_reg: float = 1.0
    # LaProp optimiser (TorchRL's DreamerV3Optimizer): adaptive gradient clipping
    # at agc x parameter norm, learning rates warmed up over this many updates.
    agc: float = 0.3
    lr_warmup_steps: int = 1000
    # How the actor's objective reaches its weights: "dynamics" backpropagates the
    # imagined return through the learned model (continuous actions only);
    # "reinforce" uses the score function with a value baseline (the paper's
    # choice for every action space); auto = dynamics when continuous.
    actor_grad: Literal["auto", "dynamics", "reinforce"] = "auto"
    # Weight of the critic's replay loss (the paper's repval, 0.3): the value
    # head also learns lambda-returns along replayed sequences, bootstrapped
    # from the imagined returns of those states. 0 turns it off.
    replay_value_scale: float = 0.3

    @property
    def latent_state_dim(self) -> int:
        """Size of the stochastic latent the envs, collectors and models carry."""
        if self.name == "dreamer_v3":
            return self.num_categoricals * self.num_classes
        return self.state_dim


@dataclass
class CollectorConfig:
    # Worker processes stepping environments; null = what the cores allow.
    num_workers: Optional[int] = None
    # Agent steps each worker returns per batch.
    frames_per_batch: int = 50
    # Random-action steps (agent steps, all workers) before the policy acts.
    init_random_frames: int = 1000
    # Push learner weights to the workers every K updates.
    weight_sync_every: int = 10
    # Device the policy runs on inside workers ("cpu" keeps GPUs for learning).
    device: str = "cpu"
    # torch.compile the acting policy inside each worker (with the compile.*
    # backend/options): every worker compiles and warms its own copy.
    compile_policy: bool = False
    # A worker process that dies (OOM kill, segfault in an env) is noticed within
    # seconds; true = rebuild the collector with the current weights, false = stop
    # with an error. Rebuilds allowed per run before giving up:
    restart_on_failure: bool = True
    max_restarts: int = 3


@dataclass
class BufferConfig:
    capacity: int = 100_000  # agent steps
    batch_size: int = 16  # sequences per update
    batch_length: int = 50  # steps per sequence
    prefetch: int = 2  # batches sampled ahead in a background thread
    # Pin host storage for async copies to CUDA; auto = pin iff CUDA is used.
    pin_memory: Literal["auto", "on", "off"] = "auto"


@dataclass
class CompileConfig:
    enabled: bool = True
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    # torch.compile rejects mode together with options: set one of the two.
    mode: Optional[Literal["default", "reduce-overhead", "max-autotune"]] = None
    options: Optional[dict[str, Any]] = field(
        default_factory=lambda: {"triton.cudagraphs": False}
    )
    # Eager-shaped calls run on the compiled losses before the first real update.
    warmup_iters: int = 2
    # Inductor's on-disk cache (compiled kernels); null = torch's default
    # (/tmp/torchinductor_$USER). A persistent path makes every later start warm.
    cache_dir: Optional[str] = None
    # A portable cache file from an earlier run (its compile_cache.bin), loaded
    # before compiling; each run saves its own into the run dir after warm-up.
    cache_artifact: Optional[str] = None


@dataclass
class LoggerConfig:
    backend: Literal["csv", "wandb", "none"] = "csv"
    project: str = "dreamer"
    # W&B mode: offline needs no account; `wandb sync` uploads later.
    mode: Literal["offline", "online", "disabled"] = "offline"
    log_every: int = 50  # updates between metric syncs
    progress_bar: bool = True
    # W&B run grouping (e.g. one group per sweep or ablation) and free-form tags.
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)


@dataclass
class EvalConfig:
    every: int = 500  # updates
    episodes: int = 5
    video: bool = False
    # Open-loop imagination video (pixel tasks only): replayed sequences whose
    # first openloop_context steps the world model observes and the rest it
    # predicts from the recorded actions alone; rows true / predicted / error.
    openloop: bool = True
    openloop_context: int = 5  # observed steps; < buffer.batch_length
    openloop_sequences: int = 4  # grid columns, from one replayed batch (at most buffer.batch_size)


@dataclass
class CheckpointConfig:
    every: int = 1000  # updates; the final checkpoint is always written
    keep: int = 2
    # Also save the replay buffer, so a resumed run samples the data it had
    # (costs buffer.capacity x bytes per step of disk per checkpoint).
    replay: bool = False


@dataclass
class ProfilingConfig:
    # Usually set from the environment (PROF_ENABLED, PROF_ITERATIONS,
    # PROF_OUTPUT_DIR, PROF_MODE), read once in load_config.
    enabled: bool = False
    # Learner updates traced, both ends included (PROF_ITERATIONS=50-55);
    # collector workers trace the same wall-clock window.
    first_update: int = 50
    last_update: int = 55
    # Per-process traces and merged_trace.json land here (relative to the cwd).
    output_dir: str = "traces"
    # lite: CPU (+CUDA) activity and our named ranges; full: also shapes, memory, stacks.
    mode: Literal["lite", "full"] = "lite"


@dataclass
class DistributedConfig:
    # Under torchrun: nccl on CUDA, gloo on CPU (auto picks by device).
    backend: Literal["auto", "gloo", "nccl"] = "auto"


@dataclass
class TrainConfig:
    total_frames: int = 40_000  # env frames (agent steps x action repeat)
    # Wall-clock budget of this invocation: past it the run finishes as if it had
    # reached total_frames (final evaluation, checkpoint, summary); null = none.
    max_minutes: Optional[float] = None
    # Replayed steps per agent step: updates/step = ratio / (batch_size*batch_length).
    train_ratio: float = 100.0
    # Updates with a non-finite loss or gradient are skipped (weights and
    # optimiser state untouched); this many in a row stop the run.
    stop_after_nonfinite: int = 10


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # Intra-op threads for the learner; null = cores left after the workers.
    threads: Optional[int] = None
    # Mixed precision for the learner; auto = bf16 only where the device runs
    # it natively (CUDA with bf16 support). fp16 is not offered: its GradScaler
    # syncs with the host every step.
    autocast: Literal["auto", "off", "bf16"] = "auto"
    # Conv encoder/decoder in NHWC memory (pixel tasks); same numbers, faster
    # convolutions (scripts/benchmark_learner.py, docs/PERFORMANCE.md).
    channels_last: bool = True
    # The learner process's malloc (glibc) keeps freed memory for reuse instead
    # of returning it to the OS: no page faults on every update's activations
    # (1.18x per V1 pixel update on CPU, docs/PERFORMANCE.md); its RSS stays at its peak. No-op off glibc.
    retain_host_memory: bool = True
    # A run directory to continue from (its newest checkpoint and config).
    resume: Optional[str] = None
    experiment: str = "default"
    # The DreamerV3 size preset applied (model=size12m, conf/model/); null =
    # the algo's own sizes. Set by the preset; it names the run (W&B, plots).
    model: Optional[str] = None


# Fields that must be > 0 (dotted paths); a zero batch or image size is a typo.
_POSITIVE = [
    "env.image_size", "env.render_size", "env.action_repeat", "env.max_episode_steps",
    "algo.state_dim", "algo.rssm_hidden_dim", "algo.hidden_dim",
    "algo.encoder_channels", "algo.world_model_lr", "algo.actor_lr", "algo.value_lr",
    "algo.grad_clip", "algo.imagination_horizon", "algo.reward_scale",
    "algo.num_categoricals", "algo.num_classes", "algo.num_bins", "algo.mlp_layers", "algo.gru_blocks",
    "algo.return_norm_min_scale",
    "collector.frames_per_batch", "collector.weight_sync_every",
    "buffer.capacity", "buffer.batch_size", "buffer.batch_length",
    "logger.log_every", "eval.every", "eval.episodes", "eval.openloop_context",
    "eval.openloop_sequences", "checkpoint.every",
    "checkpoint.keep", "train.total_frames", "train.train_ratio", "train.stop_after_nonfinite",
    "profiling.first_update",
]
_NON_NEGATIVE = [
    "collector.init_random_frames", "buffer.prefetch", "compile.warmup_iters", "env.noop_max",
    "algo.free_nats", "algo.exploration_noise", "collector.max_restarts",
    "algo.unimix", "algo.free_bits", "algo.dyn_loss_scale", "algo.rep_loss_scale",
    "algo.entropy_scale", "algo.slow_critic_reg", "algo.agc", "algo.lr_warmup_steps",
    "algo.replay_value_scale",
]
_EMA_RATES = ["algo.slow_critic_tau", "algo.return_norm_rate"]
# Fractions that must lie in [low, high).
_FRACTIONS = {"algo.unimix": (0.0, 1.0)}


# Python field -> its name in YAML, on the command line and in config.json, for
# keys a Python keyword names (a dataclass field cannot be called `import`).
KEYWORD_KEYS = {"import_": "import"}


def config_key(field_name: str) -> str:
    return KEYWORD_KEYS.get(field_name, field_name)


def _strip_literals(tp: Any) -> Any:
    """The OmegaConf-compatible twin of a type: Literal[...] -> str."""
    if get_origin(tp) is Literal:
        return str
    if get_origin(tp) is Union:
        return Optional[_strip_literals(next(a for a in get_args(tp) if a is not type(None)))]
    if dataclasses.is_dataclass(tp):
        return omegaconf_schema(tp)
    return tp


_SCHEMAS: dict[type, type] = {}


def _schema_dataclass(name: str, fields: list[tuple[str, Any, Any]]) -> type:
    """``make_dataclass``, also for keys that are Python keywords (``import``).

    make_dataclass refuses a keyword because the ``__init__``, ``__repr__`` and
    ``__eq__`` it generates would not parse. OmegaConf only reads a schema's
    fields and defaults and never builds one, so such a schema goes without them.
    """
    if not any(keyword.iskeyword(key) for key, _, _ in fields):
        return dataclasses.make_dataclass(name, fields)
    namespace: dict[str, Any] = {"__annotations__": {key: tp for key, tp, _ in fields}}
    namespace.update({key: default for key, _, default in fields})
    return dataclasses.dataclass(init=False, repr=False, eq=False)(type(name, (), namespace))


def omegaconf_schema(cls: type) -> type:
    """A dataclass mirroring ``cls`` that OmegaConf accepts (for the ConfigStore),
    its fields named as in YAML (:data:`KEYWORD_KEYS`)."""
    if cls in _SCHEMAS:
        return _SCHEMAS[cls]
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        default = (
            field(default=f.default)
            if f.default is not dataclasses.MISSING
            else field(default_factory=f.default_factory)
        )
        if dataclasses.is_dataclass(hints[f.name]):
            # The schema class itself, not an instance: OmegaConf reads its defaults.
            default = field(default_factory=lambda nested=omegaconf_schema(hints[f.name]): nested)
        fields.append((config_key(f.name), _strip_literals(hints[f.name]), default))
    schema = _schema_dataclass(cls.__name__ + "Schema", fields)
    _SCHEMAS[cls] = schema
    return schema


def register_configs() -> None:
    """Register the schema so conf/config.yaml can use it as its base, and our
    requeueing launcher as ``hydra/launcher=submitit_local``."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf

    cs = ConfigStore.instance()
    cs.store(name="dreamer_schema", node=omegaconf_schema(Config))
    # submitit_local runs the very requeue path the SLURM launcher
    # (conf/hydra/launcher/slurm.yaml) runs on a cluster. Hydra's plugin scan
    # re-runs the plugin's own registration, so scan first, then replace it. (A
    # YAML file of that name would trip Hydra's deprecated schema matching.)
    Plugins.instance()
    cs.store(
        group="hydra/launcher", name="submitit_local", provider="dreamer",
        node=LocalQueueConf(_target_="hydra_plugins.dreamer_launcher.requeue.RequeueingLocalLauncher"),
    )


_SCALARS = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}


def _check_value(path: str, tp: Any, value: Any) -> None:
    origin = get_origin(tp)
    if origin is Union:
        if value is None:
            return
        tp = next(a for a in get_args(tp) if a is not type(None))
        origin = get_origin(tp)
    if tp in _SCALARS:
        ok = isinstance(value, _SCALARS[tp]) and not (tp is not bool and isinstance(value, bool))
        if not ok:
            raise UserError(f"{path}={value!r} must be a {tp.__name__}")
        return
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"{path}={value!r} must be a list, e.g. {path}=[a,b]")
        for index, item in enumerate(value):
            _check_value(f"{path}[{index}]", get_args(tp)[0], item)
        return
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            shown = ", ".join("null" if a is None else str(a) for a in allowed)
            raise UserError(f"{path}={value!r} is not allowed; choose one of: {shown}")


def _build(cls: type, data: dict, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    field_of = {config_key(f.name): f.name for f in dataclasses.fields(cls)}  # YAML key -> field
    unknown = sorted(set(data) - set(field_of))
    if unknown:
        raise UserError(
            f"unknown config key {prefix}{unknown[0]}; known keys here: {', '.join(sorted(field_of))}"
        )
    kwargs = {}
    for key in field_of.keys() & set(data):
        name, value = field_of[key], data[key]
        tp, path = hints[name], prefix + key
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value or {}, path + ".")
        else:
            _check_value(path, tp, value)
            kwargs[name] = value
    return cls(**kwargs)


def get_path(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def validate(cfg: Config) -> Config:
    """Cross-field checks; each failure is one line saying what to change."""
    for path in _POSITIVE:
        if get_path(cfg, path) <= 0:
            raise UserError(f"{path}={get_path(cfg, path)} must be > 0")
    for path in _NON_NEGATIVE:
        if get_path(cfg, path) < 0:
            raise UserError(f"{path}={get_path(cfg, path)} must be >= 0")
    for path, (low, high) in _FRACTIONS.items():
        if not low <= get_path(cfg, path) < high:
            raise UserError(f"{path}={get_path(cfg, path)} must be in [{low}, {high})")
    for path in _EMA_RATES:
        if not 0.0 < get_path(cfg, path) <= 1.0:
            raise UserError(f"{path}={get_path(cfg, path)} is an EMA rate: it must be in (0, 1]")
    if cfg.algo.name == "dreamer_v3" and cfg.algo.rssm_hidden_dim % cfg.algo.gru_blocks:
        raise UserError(
            f"algo.rssm_hidden_dim={cfg.algo.rssm_hidden_dim} does not split into "
            f"algo.gru_blocks={cfg.algo.gru_blocks} equal blocks: pick a divisor (1 = one plain GRU)"
        )
    if cfg.algo.num_bins < 2 or cfg.algo.num_bins % 2 == 0:
        raise UserError(
            f"algo.num_bins={cfg.algo.num_bins} must be odd and >= 3, so one bin sits at 0"
        )
    if cfg.model is not None and cfg.algo.name != "dreamer_v3":
        raise UserError(
            f"model={cfg.model} is a DreamerV3 size preset, but algo.name={cfg.algo.name}: "
            f"add algo=dreamer_v3 (or drop model= to keep {cfg.algo.name}'s own sizes)"
        )
    if cfg.compile.mode is not None and cfg.compile.options:
        raise UserError(
            f"compile.mode={cfg.compile.mode} and compile.options are both set; torch.compile "
            "accepts only one: add compile.options=null or compile.mode=null"
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


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def profiling_from_env(environ: typing.Mapping[str, str]) -> dict:
    """The profiling.* keys set by PROF_* environment variables (the profiling
    workflow's interface); read here, once, so nothing deeper reads the environment."""
    out: dict = {}
    if "PROF_ENABLED" in environ:
        flag = environ["PROF_ENABLED"].strip().lower()
        if flag not in _TRUE + _FALSE:
            raise UserError(f"PROF_ENABLED={environ['PROF_ENABLED']!r} must be 1 or 0")
        out["enabled"] = flag in _TRUE
    if "PROF_ITERATIONS" in environ:
        text = environ["PROF_ITERATIONS"]
        first, sep, last = text.partition("-")
        if not (first.strip().isdigit() and (not sep or last.strip().isdigit())):
            raise UserError(f"PROF_ITERATIONS={text!r} must be FIRST-LAST learner updates, e.g. 50-55")
        out["first_update"] = int(first)
        out["last_update"] = int(last) if sep else int(first)
    if "PROF_OUTPUT_DIR" in environ:
        out["output_dir"] = environ["PROF_OUTPUT_DIR"]
    if "PROF_MODE" in environ:
        out["mode"] = environ["PROF_MODE"].strip().lower()
    return out


def load_config(dict_cfg: Any, environ: Optional[typing.Mapping[str, str]] = None) -> Config:
    """Composed Hydra/OmegaConf config (or a plain dict) -> validated Config.

    ``environ`` (the process environment, passed by the entry point) may set
    the profiling keys through PROF_* variables; they win over the YAML.
    """
    from omegaconf import DictConfig, OmegaConf

    if isinstance(dict_cfg, DictConfig):
        dict_cfg = OmegaConf.to_container(dict_cfg, resolve=True)
    dict_cfg = {k: v for k, v in dict_cfg.items() if k != "hydra"}
    from_env = profiling_from_env(environ or {})
    if from_env:
        dict_cfg["profiling"] = {**(dict_cfg.get("profiling") or {}), **from_env}
    return validate(_build(Config, dict_cfg, ""))


def to_dict(cfg: Any) -> dict:
    """A config as a plain dict keyed as in YAML (``env.import``), what
    :func:`load_config` reads back (config.json, checkpoints, W&B)."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        out[config_key(f.name)] = to_dict(value) if dataclasses.is_dataclass(value) else copy.deepcopy(value)
    return out
