"""The config schema: dataclasses only, the one source of every default.

The defaults are the run ``python -m dreamer`` makes: Dreamer V3 at CPU scale
on gymnasium Pendulum-v1 from its state, 16k env frames, eager. Hydra composes
``conf/`` on top of these classes (YAML only overrides: a preset holds what
differs from here; the group options that would merely repeat a default, e.g.
``algo=dreamer_v3`` or ``collector=default``, are these classes themselves,
registered in :mod:`dreamer.config.hydra_store`). :func:`dreamer.config.load_config` turns the
composed config into them (:mod:`dreamer.config.load`) and checks every value
(:mod:`dreamer.config.validate`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from dreamer.config.domains import EMA_RATE, FRACTION, NON_NEGATIVE, POSITIVE, PROBABILITY, SEED, Range, within


@dataclass
class EnvConfig:
    # gymnasium: any registered id (e.g. Pendulum-v1); dm_control: "domain-task"
    # (e.g. cheetah-run); atari: the ALE game name (e.g. Pong).
    backend: Literal["gymnasium", "dm_control", "atari"] = "gymnasium"
    name: str = "Pendulum-v1"
    from_pixels: bool = False
    # Size the model sees (learner-side resize target, square).
    image_size: int = within(64, POSITIVE)
    # Size frames are stored at (uint8). DMC renders at this size directly;
    # gymnasium/Atari frames are downsampled to it in the worker (uint8 in,
    # uint8 out) so a 500x500 render never reaches the replay buffer.
    render_size: int = within(64, POSITIVE)
    grayscale: bool = False
    action_repeat: int = within(2, POSITIVE)
    # Episode limit in agent steps (after action repeat); Pendulum-v1's own limit
    # is 200 env steps = 100 agent steps at action repeat 2.
    max_episode_steps: int = within(100, POSITIVE)
    # Atari only: probability of repeating the previous action (ALE v5 default).
    sticky_action_prob: float = within(0.25, PROBABILITY)
    # Atari only: no-op starts. After each reset a random number of emulator
    # frames in [0, noop_max] pass with the NOOP action (raw frames, not agent
    # steps, as in DQN's and DreamerV3's protocol: 30); 0 = off.
    noop_max: int = within(0, NON_NEGATIVE)
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
    rssm_hidden_dim: int = within(domain=POSITIVE)
    hidden_dim: int = within(domain=POSITIVE)
    encoder_channels: int = within(domain=POSITIVE)
    world_model_lr: float = within(domain=POSITIVE)
    actor_lr: float = within(domain=POSITIVE)
    value_lr: float = within(domain=POSITIVE)
    adam_eps: float = within(domain=POSITIVE)
    gamma: float = within(domain=Range(0, 1, low_open=True))
    # The lambda-return's mix of bootstrapped values (0) and observed rewards (1).
    lmbda: float = within(0.95, PROBABILITY)
    imagination_horizon: int = within(15, POSITIVE)
    # Rewards the learner sees are multiplied by this (reported returns are not).
    # Dreamer's learning rates assume O(1) rewards, as in DMC; Pendulum's reach -16.
    reward_scale: float = within(1.0, POSITIVE)

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
    state_dim: int = within(30, POSITIVE)
    activation: Literal["elu", "relu", "silu", "tanh"] = "elu"
    grad_clip: float = within(100.0, POSITIVE)
    kl_scale: float = within(1.0, NON_NEGATIVE)
    free_nats: float = within(3.0, NON_NEGATIVE)
    exploration_noise: float = within(0.3, NON_NEGATIVE)
    # 0: the paper's V1, whose lambda-returns bootstrap from the critic being
    # trained. > 0: from a slow copy that moves this fraction toward the critic
    # after every update (DreamerV2/V3's stabiliser; 0.02 is V3's rate).
    slow_value_tau: float = within(0.0, FRACTION)
    # Conv encoder/decoder in NHWC memory (pixel tasks); same numbers, faster
    # convolutions on CPU (docs/PERFORMANCE.md).
    channels_last: bool = True

    @property
    def latent_state_dim(self) -> int:
        return self.state_dim


@dataclass(kw_only=True)
class DreamerV3Config(AlgoConfig):
    """Dreamer V3 (Hafner et al., 2023) with TorchRL's V3 losses, modules and
    optimiser, at CPU scale: the paper's defaults except the sizes, learning
    rates, warm-up and horizon, chosen so a CPU learns in a few thousand
    updates; one set for every task (``experiment=small``). The paper's sizes
    are the ``model=size*`` presets (conf/model/); its rates and horizon are in
    the published presets (``experiment=dmc_vision_v3``, ...)."""

    name: Literal["dreamer_v3"] = "dreamer_v3"
    # Small networks: a 64-unit GRU (in gru_blocks blocks) and 64-unit MLPs.
    rssm_hidden_dim: int = 64
    hidden_dim: int = 64
    encoder_channels: int = 16  # image encoder depth (channels x 2, 3, 4, 4 per stage)
    # LaProp with adaptive gradient clipping (DreamerV3Optimizer); adam_eps is
    # its epsilon. Rates well above the paper's 4e-5 (tuned for 100M-parameter
    # models and millions of updates): with LaProp every weight moves at most
    # about lr per update, and a CPU run makes only a few thousand.
    world_model_lr: float = 3e-4
    actor_lr: float = 1e-4
    value_lr: float = 1e-4
    adam_eps: float = 1e-20
    # Horizon 1 / (1 - gamma) = 100 (the paper's 0.997: 333; the replayed value loss divides by 1 - gamma).
    gamma: float = within(0.99, Range(0, 1, low_open=True, high_open=True))
    # Categorical latent: num_categoricals one-hot vectors of num_classes each.
    num_categoricals: int = within(16, POSITIVE)
    num_classes: int = within(16, POSITIVE)
    # Mix of the uniform distribution into every categorical (latents, discrete actions).
    unimix: float = within(0.01, FRACTION)
    # KL below this many nats (per step) is not penalised.
    free_bits: float = within(1.0, NON_NEGATIVE)
    # World-model loss weights: prediction (recon/reward/continue) is 1.
    dyn_loss_scale: float = within(0.5, NON_NEGATIVE)
    rep_loss_scale: float = within(0.1, NON_NEGATIVE)
    # Reward and value heads: two-hot over this many symexp-spaced bins.
    num_bins: int = within(255, POSITIVE)
    # The RSSM's recurrent core as gru_blocks block-diagonal GRUs (the paper's 8:
    # rssm_hidden_dim / 8 units each, an eighth of a full GRU's weights); 1 = one plain GRU.
    gru_blocks: int = within(8, POSITIVE)
    # Hidden layers of every V3 MLP (encoder, decoder, heads, actor, value).
    mlp_layers: int = within(2, POSITIVE)
    # Actor entropy bonus and return normalisation (5th-95th percentile range,
    # an EMA with this rate, never dividing by less than min_scale).
    entropy_scale: float = within(3.0e-4, NON_NEGATIVE)
    # Initial scale of the actor's output layer (x its fan-in initialisation), for
    # discrete and continuous actions; the reference's 0.01 starts every state near
    # the same action distribution (continuous: mean 0, std 0.9).
    policy_outscale: float = within(0.01, NON_NEGATIVE)
    return_norm_rate: float = within(0.01, EMA_RATE)
    return_norm_min_scale: float = within(1.0, POSITIVE)
    # Slow critic: EMA of the value weights (tau per update) that regularises it.
    slow_critic_tau: float = within(0.02, EMA_RATE)
    slow_critic_reg: float = within(1.0, NON_NEGATIVE)
    # LaProp optimiser (TorchRL's DreamerV3Optimizer): adaptive gradient clipping
    # at agc x parameter norm, learning rates warmed up over this many updates
    # (the paper's 1000).
    agc: float = within(0.3, NON_NEGATIVE)  # 0: no clipping
    lr_warmup_steps: int = within(100, NON_NEGATIVE)
    # How the actor's objective reaches its weights: "dynamics" backpropagates the
    # imagined return through the learned model (continuous actions only);
    # "reinforce" uses the score function with a value baseline (the paper's
    # choice for every action space); auto = dynamics when continuous.
    actor_grad: Literal["auto", "dynamics", "reinforce"] = "auto"
    # Weight of the critic's replay loss (the paper's repval, 0.3): the value
    # head also learns lambda-returns along replayed sequences, bootstrapped
    # from the imagined returns of those states. 0 turns it off.
    replay_value_scale: float = within(0.3, NON_NEGATIVE)
    # The replay loss also trains the world model (its gradient through the
    # replayed posteriors), as the reference's repval_grad does; needs joint_update.
    repval_grad: bool = True
    # The reference's update order: every loss from the same weights, one backward
    # of their sum, every optimiser stepped together (one skip flag per update).
    # false: Dreamer's order, the world model stepped before the actor imagines.
    joint_update: bool = True

    @property
    def latent_state_dim(self) -> int:
        return self.num_categoricals * self.num_classes


# algo.name -> its class (the algo=NAME group options are these classes).
ALGO_CONFIGS: dict[str, type[AlgoConfig]] = {"dreamer_v1": DreamerV1Config, "dreamer_v3": DreamerV3Config}


@dataclass
class CollectorConfig:
    # Worker processes stepping environments; null = what the cores allow
    # (cores - 1, at least 1); 0 = collect in the main process.
    num_workers: Optional[int] = within(None, Range(0, null="automatic"))
    # Agent steps each worker returns per batch.
    frames_per_batch: int = within(100, POSITIVE)
    # Random-action steps (agent steps, all workers) before the policy acts.
    init_random_frames: int = within(2000, NON_NEGATIVE)
    # Push learner weights to the workers every K updates.
    weight_sync_every: int = within(10, POSITIVE)
    # Device the policy runs on inside workers ("cpu" keeps GPUs for learning).
    device: str = "cpu"
    # torch.compile the acting policy inside each worker (with the compile.*
    # backend/options): every worker compiles and warms its own copy.
    compile_policy: bool = False
    # A worker process that dies (OOM kill, segfault in an env) is noticed within
    # seconds; true = rebuild the collector with the current weights, false = stop
    # with an error. Rebuilds allowed per run before giving up:
    restart_on_failure: bool = True
    max_restarts: int = within(3, NON_NEGATIVE)


@dataclass
class BufferConfig:
    capacity: int = within(100_000, POSITIVE)  # agent steps
    batch_size: int = within(16, POSITIVE)  # sequences per update
    batch_length: int = within(16, POSITIVE)  # steps per sequence
    prefetch: int = within(2, NON_NEGATIVE)  # batches sampled ahead in a background thread
    # Pin host storage for async copies to CUDA; auto = pin iff CUDA is used.
    pin_memory: Literal["auto", "on", "off"] = "auto"


@dataclass
class CompileConfig:
    # Actor and value losses go through torch.compile; the world model's loop
    # over time stays eager (see rssm_step). Off by default (compile=off): a
    # short run gains little, and an eager run needs no C++ compiler; compile=on
    # turns it on (the presets do).
    enabled: bool = False
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
    # called once per time step from the eager loop, never with CUDA graphs
    # (faster updates: docs/PERFORMANCE.md). V1's rollout has no compiled step
    # upstream: there the key changes nothing.
    rssm_step: bool = True
    # Which update runs (dreamer/algos/update_paths.py): losses = the world model
    # eager and the actor/value losses compiled (the design card's shape); whole =
    # the whole update (losses, backward, optimiser steps, slow critic, metrics) as
    # one torch.compile graph; captured = that update replayed from CUDA graphs
    # (CUDA only; with compile.enabled=false the eager update is captured);
    # auto = by measurement: captured (its eager body) on CUDA, losses on the CPU.
    # The start log names the path.
    update: Literal["auto", "losses", "whole", "captured"] = "auto"
    # Eager-shaped calls run on the compiled losses before the first real update.
    warmup_iters: int = within(2, NON_NEGATIVE)
    # Compile in a spawned process while updates run eager, then switch to the
    # compiled losses (dreamer/run/background_compile.py): no minutes-long wait
    # before learning starts. false: compile and warm up before the first update
    # (the switch update then never depends on timing). Runs with several ranks
    # always compile first, so every rank switches at the same update.
    background: bool = True
    # A background compile still running after this long is taken as hung: it is
    # stopped and the losses stay eager (the learner gets its thread back).
    background_timeout_minutes: float = within(60.0, POSITIVE)
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
    log_every: int = within(50, POSITIVE)  # updates between metric syncs
    progress_bar: bool = True
    # W&B run grouping (e.g. one group per sweep or ablation) and free-form tags.
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)


@dataclass
class EvalConfig:
    every: int = within(250, POSITIVE)  # updates
    episodes: int = within(10, POSITIVE)
    # How the evaluated policy acts: sample = draws from the actor's distribution, as
    # DreamerV3's reference scores its episodes (comparable with published curves);
    # mode = its most likely action (a near-uniform discrete actor then repeats one
    # action). Metrics are named for it: eval_sample_return_mean, eval_mode_return_mean.
    policy: Literal["sample", "mode"] = "sample"
    video: bool = False
    # Open-loop imagination video (pixel tasks only): replayed sequences whose
    # first openloop_context steps the world model observes and the rest it
    # predicts from the recorded actions alone; rows true / predicted / error.
    openloop: bool = True
    openloop_context: int = within(5, POSITIVE)  # observed steps; < buffer.batch_length
    openloop_sequences: int = within(4, POSITIVE)  # grid columns, from one replayed batch (at most buffer.batch_size)


@dataclass
class CheckpointConfig:
    every: int = within(500, POSITIVE)  # updates; the final checkpoint is always written
    keep: int = within(2, POSITIVE)
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
    first_update: int = within(50, POSITIVE)
    last_update: int = within(55, POSITIVE)
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
    total_frames: int = within(16_000, POSITIVE)  # env frames (agent steps x action repeat)
    # Wall-clock budget of this invocation: past it the run finishes as if it had
    # reached total_frames (final evaluation, checkpoint, summary); null = none.
    max_minutes: Optional[float] = within(None, Range(0, low_open=True, null="no limit"))
    # Replayed steps per agent step: updates/step = ratio / (batch_size*batch_length)
    # (128 at 16 x 16: one update every 2 agent steps).
    train_ratio: float = within(128.0, POSITIVE)
    # Updates with a non-finite loss or gradient are skipped (weights and
    # optimiser state untouched); this many in a row stop the run.
    stop_after_nonfinite: int = within(10, POSITIVE)


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    # The class algo.name names (ALGO_CONFIGS).
    algo: Union[DreamerV1Config, DreamerV3Config] = field(default_factory=DreamerV3Config)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = within(0, SEED)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # Intra-op threads for the learner; null = cores left after the workers.
    threads: Optional[int] = within(None, Range(0, low_open=True, null="automatic"))
    # Mixed precision for the learner; auto = bf16 only where the device runs
    # it natively (CUDA with bf16 support). fp16 is not offered: its GradScaler
    # syncs with the host every step.
    autocast: Literal["auto", "off", "bf16"] = "auto"
    # The learner process's malloc (glibc) keeps freed memory for reuse instead
    # of returning it to the OS: no page faults on every update's activations
    # (docs/PERFORMANCE.md); its RSS stays at its peak. No-op off glibc.
    retain_host_memory: bool = True
    # On CUDA: TF32 matmuls and convolutions and cudnn.benchmark (fixed shapes:
    # the fastest conv kernels are found once); false = full fp32 precision.
    cuda_fast_math: bool = True
    # A run directory to continue from (its newest checkpoint and config).
    resume: Optional[str] = None
    # The preset's name (experiment=NAME sets it); it names the run's directory.
    experiment: str = "default"
    # The DreamerV3 size preset applied (model=size12m, conf/model/); null =
    # the algo's own sizes. Set by the preset; it names the run (W&B, plots).
    model: Optional[str] = None
