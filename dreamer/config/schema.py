"""The config schema: dataclasses only, the one source of every default.

Hydra composes ``conf/`` on top of these classes (YAML only overrides; the
group options that would merely repeat a default, e.g. ``algo=dreamer_v3`` or
``collector=default``, are these classes themselves, registered in
:mod:`dreamer.config.hydra_store`). :func:`dreamer.config.load_config` turns the
composed config into them (:mod:`dreamer.config.load`) and checks every value
(:mod:`dreamer.config.validate`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union


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


@dataclass(kw_only=True)
class AlgoConfig(abc.ABC):
    """What both Dreamer versions read; each version's class below sets its own
    defaults (``algo.name`` picks the class: :data:`ALGO_CONFIGS`)."""

    name: str
    rssm_hidden_dim: int
    hidden_dim: int
    encoder_channels: int
    world_model_lr: float
    actor_lr: float
    value_lr: float
    adam_eps: float
    gamma: float
    lmbda: float = 0.95
    imagination_horizon: int = 15
    # Rewards the learner sees are multiplied by this (reported returns are not).
    # Dreamer's learning rates assume O(1) rewards, as in DMC; Pendulum's reach -16.
    reward_scale: float = 1.0

    @property
    @abc.abstractmethod
    def latent_state_dim(self) -> int:
        """Size of the stochastic latent the envs, collectors and models carry."""


@dataclass(kw_only=True)
class DreamerV1Config(AlgoConfig):
    """Dreamer V1 (Hafner et al., 2020) with TorchRL's losses; paper defaults."""

    name: Literal["dreamer_v1"] = "dreamer_v1"
    rssm_hidden_dim: int = 200
    hidden_dim: int = 400
    encoder_channels: int = 32
    world_model_lr: float = 6e-4
    actor_lr: float = 8e-5
    value_lr: float = 8e-5
    adam_eps: float = 1e-7
    gamma: float = 0.99
    # Size of the Gaussian stochastic latent.
    state_dim: int = 30
    activation: Literal["elu", "relu", "silu", "tanh"] = "elu"
    grad_clip: float = 100.0
    kl_scale: float = 1.0
    free_nats: float = 3.0
    exploration_noise: float = 0.3
    # 0: the paper's V1, whose lambda-returns bootstrap from the critic being
    # trained. > 0: from a slow copy that moves this fraction toward the critic
    # after every update (DreamerV2/V3's stabiliser; 0.02 is V3's rate).
    slow_value_tau: float = 0.0
    # Conv encoder/decoder in NHWC memory (pixel tasks); same numbers, faster
    # convolutions (scripts/benchmark_learner.py, docs/PERFORMANCE.md).
    channels_last: bool = True

    @property
    def latent_state_dim(self) -> int:
        return self.state_dim


@dataclass(kw_only=True)
class DreamerV3Config(AlgoConfig):
    """Dreamer V3 (Hafner et al., 2023) with TorchRL's V3 losses, modules and
    optimiser; paper defaults. Sizes are small (runs on a CPU); raise hidden_dim,
    rssm_hidden_dim, mlp_layers and encoder_channels for the paper's sizes
    (model=size12m, ...: conf/model/)."""

    name: Literal["dreamer_v3"] = "dreamer_v3"
    rssm_hidden_dim: int = 256
    hidden_dim: int = 256
    encoder_channels: int = 16  # image encoder depth (channels x 2, 3, 4, 4 per stage)
    # LaProp with adaptive gradient clipping (DreamerV3Optimizer), one rate for
    # all; adam_eps is its epsilon.
    world_model_lr: float = 4e-5
    actor_lr: float = 4e-5
    value_lr: float = 4e-5
    adam_eps: float = 1e-20
    gamma: float = 0.997  # horizon 333
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
        return self.num_categoricals * self.num_classes


# algo.name -> its class (the algo=NAME group options are these classes).
ALGO_CONFIGS: dict[str, type[AlgoConfig]] = {"dreamer_v1": DreamerV1Config, "dreamer_v3": DreamerV3Config}


@dataclass
class CollectorConfig:
    # Worker processes stepping environments; null = what the cores allow
    # (cores - 1, at least 1); 0 = collect in the main process.
    num_workers: Optional[int] = None
    # Agent steps each worker returns per batch.
    frames_per_batch: int = 100
    # Random-action steps (agent steps, all workers) before the policy acts.
    init_random_frames: int = 2000
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
    # Actor and value losses go through torch.compile; the world model's loop
    # over time stays eager (see rssm_step).
    enabled: bool = True
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    # torch.compile rejects mode together with options: set one of the two.
    # reduce-overhead and max-autotune bring CUDA graphs (see cudagraphs).
    mode: Optional[Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]] = None
    options: Optional[dict[str, Any]] = field(
        default_factory=lambda: {"triton.cudagraphs": False}
    )
    # CUDA graphs on the compiled losses. Off by design: the losses update
    # buffers in place and reuse outputs after backward, which graph replay
    # breaks; true is the explicit ask a CUDA-graph mode needs.
    cudagraphs: bool = False
    # Dreamer V3: also compile one step of the world model's RSSM rollout (prior
    # and posterior, forward and backward; TorchRL's RSSMRolloutV3.compile_rollout),
    # called once per time step from the eager loop, never with CUDA graphs.
    # 1.10-1.16x per update on a 2-core CPU (docs/PERFORMANCE.md). V1's rollout
    # has no compiled step upstream: there the key changes nothing.
    rssm_step: bool = True
    # Which update runs (dreamer/algos/update_paths.py): card = the world model
    # eager and the actor/value losses compiled (the design card's shape); whole =
    # the whole update (losses, backward, optimiser steps, slow critic, metrics) as
    # one torch.compile graph; captured = that update replayed from CUDA graphs
    # (CUDA only; with compile.enabled=false the eager update is captured);
    # auto = card until measurements say otherwise. The start log names the path.
    update: Literal["auto", "card", "whole", "captured"] = "auto"
    # Eager-shaped calls run on the compiled losses before the first real update.
    warmup_iters: int = 2
    # Compile in a spawned process while updates run eager, then switch to the
    # compiled losses (dreamer/run/background_compile.py): no minutes-long wait
    # before learning starts. false: compile and warm up before the first update
    # (the switch update then never depends on timing). Runs with several ranks
    # always compile first, so every rank switches at the same update.
    background: bool = True
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
    # The class algo.name names (ALGO_CONFIGS).
    algo: Union[DreamerV1Config, DreamerV3Config] = field(default_factory=DreamerV1Config)
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
    # The learner process's malloc (glibc) keeps freed memory for reuse instead
    # of returning it to the OS: no page faults on every update's activations
    # (1.18x per V1 pixel update on CPU, docs/PERFORMANCE.md); its RSS stays at its peak. No-op off glibc.
    retain_host_memory: bool = True
    # On CUDA: TF32 matmuls and convolutions and cudnn.benchmark (fixed shapes:
    # the fastest conv kernels are found once); false = full fp32 precision.
    cuda_fast_math: bool = True
    # A run directory to continue from (its newest checkpoint and config).
    resume: Optional[str] = None
    experiment: str = "default"
    # The DreamerV3 size preset applied (model=size12m, conf/model/); null =
    # the algo's own sizes. Set by the preset; it names the run (W&B, plots).
    model: Optional[str] = None
