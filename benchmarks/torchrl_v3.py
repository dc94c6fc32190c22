"""Seconds per update of TorchRL's own DreamerV3 stepper, built as its recipe builds it: a side for
benchmarks/peers.py and benchmarks/gpu_bench.py, and runnable alone.

    python benchmarks/torchrl_v3.py experiment=small algo.actor_grad=reinforce
    python benchmarks/torchrl_v3.py experiment=gym_state_v3 algo.actor_grad=reinforce --compiled --reps 5

The learner comes from the recipe the installed torchrl wheel ships (sota-implementations/dreamer_v3,
imported by file path, never copied): its ``_build_learner`` (world model, imagination env, actor and
value losses, the one DreamerV3Optimizer over every weight, the slow-critic SoftUpdate) and
``_make_learner_update`` (``DreamerV3Loss`` inside
``torchrl.trainers.algorithms.DreamerV3OptimizationStepper``), warmed up with a replay sample when it
compiles, as ``_warm_up_learner`` does. Its config (the recipe's keys; the wheel ships no config.yaml)
is read off our composed config (``recipe_config``): same sizes, losses and returns, so both sides
hold the same parameters module by module. Where the recipe has a setting ours lacks it follows ours:
reward and continue heads with algo.mlp_layers layers (the recipe's default, as the JAX reference's,
is 1). Not compute: the recipe takes one learning rate (ours: algo.world_model_lr).

Modes (``compiled``): eager (``optimization.compile=off``), or compiled as the recipe's
``optimization.compile=auto`` compiles on CUDA: the whole forward/backward compiled with the RSSM as
a higher-order scan (unrolled 8 steps), plus CUDA-graph capture on CUDA. bf16 autocast on CUDA where
ours autocasts (``cfg.autocast``), fp32 elsewhere.

Its replay: a random-action rollout of the recipe's own primed env (``make_primed_env``: Pendulum-v1
states, is_init, zero state/belief) in TorchRL's ``TensorDictReplayBuffer`` with a ``SliceSampler``
(sequences inside one episode), sampled and moved to the device outside the timing; on pixel configs
each step also carries a 64x64 uint8 frame of random Pendulum play (``("next", "pixels")``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from harness import Built, compose, count_params, math_flags, time_calls

RECIPE_FILES = ("dreamer_v3_utils", "dreamer_v3_agent", "dreamer_v3_replay")  # what its train.py imports by name
SCAN_UNROLL = 8  # the recipe's rssm_scan_unroll


def recipe_dir() -> Path:
    import torchrl

    path = Path(torchrl.__file__).resolve().parent.parent / "sota-implementations" / "dreamer_v3"
    if not (path / "train.py").exists():
        raise SystemExit(f"error: TorchRL's DreamerV3 recipe is not installed at {path}")
    return path


def recipe_train():
    """The recipe's train.py as a module, its sibling helpers registered under the names it imports."""
    folder = recipe_dir()
    module = None
    for name, file in [(n, n) for n in RECIPE_FILES] + [("dreamer_v3_train", "train")]:
        if name in sys.modules:
            module = sys.modules[name]
            continue
        spec = importlib.util.spec_from_file_location(name, folder / f"{file}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


# -- the parent: the recipe's config, read off ours --------------------------------------------------------
def recipe_config(cfg, *, compiled: bool, cuda: bool) -> dict:
    """The recipe's config keys that ``_build_learner`` and ``_make_learner_update`` read, set from our
    composed DreamerV3 ``cfg`` (a gymnasium env, states or pixels)."""
    from dreamer.algos.v3.learner import _use_reinforce
    from dreamer.algos.v3.models import ACTOR_MAX_STD, ACTOR_MIN_STD, IMAGE_KERNEL, IMAGE_MULTS

    a, b, e = cfg.algo, cfg.buffer, cfg.env
    if a.name != "dreamer_v3" or e.backend != "gymnasium":
        raise SystemExit("error: the TorchRL side maps DreamerV3 on a gymnasium env only")
    layers = a.mlp_layers
    bf16 = cuda and cfg.autocast != "off"
    return {
        "env": {"name": e.name, "backend": "gym", "seed": cfg.seed, "use_seed": True,
                "max_episode_steps": e.max_episode_steps, "image_size": e.image_size,
                "vector_key": None if e.from_pixels else "observation",
                "pixels_key": "pixels" if e.from_pixels else None},
        "collector": {"num_envs": 1},
        "replay_buffer": {"batch_size": b.batch_size, "seq_len": b.batch_length},
        "networks": {
            "hidden_dim": a.hidden_dim, "rnn_hidden_dim": a.rssm_hidden_dim, "num_categoricals": a.num_categoricals,
            "num_classes": a.num_classes, "unimix": a.unimix, "norm_eps": 1e-4,
            "recurrent_model": "block_gru" if a.gru_blocks > 1 else "gru", "num_blocks": a.gru_blocks,
            "dynamics_layers": 1, "prior_layers": 2, "posterior_layers": 1,  # RSSMPriorV3 / PosteriorV3's, as ours
            "encoder_layers": layers, "decoder_layers": layers, "reward_layers": layers, "actor_layers": layers,
            "value_layers": layers, "decoder_event_dims": None,
            "num_reward_bins": a.num_bins, "num_value_bins": a.num_bins,
            "image_depth": a.encoder_channels, "image_mults": list(IMAGE_MULTS), "image_kernel_size": IMAGE_KERNEL,
            "image_decoder_blocks": 1, "policy_min_std": ACTOR_MIN_STD, "policy_max_std": ACTOR_MAX_STD,
        },
        "optimization": {
            "compile": "auto" if compiled else "off", "compile_train_step": compiled,
            "compile_rssm": "scan" if compiled else None, "rssm_scan_unroll": SCAN_UNROLL,
            "cudagraph_train_step": compiled and cuda, "compile_train_step_mode": "default",
            "mixed_precision": bf16,
            "free_bits": a.free_bits, "dynamic_loss_weight": a.dyn_loss_scale,
            "representation_loss_weight": a.rep_loss_scale, "imagination_horizon": a.imagination_horizon,
            "use_reinforce": _use_reinforce(a.actor_grad, discrete=False), "gamma": a.gamma, "lmbda": a.lmbda,
            "continuation_horizon": 1.0 / (1.0 - a.gamma), "return_normalization_rate": a.return_norm_rate,
            "return_normalization_min_scale": a.return_norm_min_scale,
            "slow_critic_regularization": a.slow_critic_reg, "slow_critic_tau": a.slow_critic_tau,
            "replay_value_loss_weight": a.replay_value_scale,
            "lr": a.world_model_lr, "adaptive_grad_clip": a.agc, "optimizer_eps": a.adam_eps,
            "warmup_steps": a.lr_warmup_steps,
        },
    }


def describe(recipe: dict) -> list[str]:
    """The recipe config as printable lines (what the side runs)."""
    return [f"{group}: " + " ".join(f"{k}={v}" for k, v in recipe[group].items())
            for group in ("networks", "optimization", "replay_buffer")]


# -- the side, inside its own process ----------------------------------------------------------------------
def rendered_frames(env_name: str, steps: int, size: int, seed: int):
    """(steps, 3, size, size) uint8 frames of random play of gymnasium ``env_name``, shrunk from its render."""
    import gymnasium as gym
    import torch
    import torch.nn.functional as F

    env = gym.make(env_name, render_mode="rgb_array")
    env.action_space.seed(seed)
    env.reset(seed=seed)
    frames = []
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        frame = torch.from_numpy(env.render().copy()).permute(2, 0, 1)[None].float()
        frames.append(F.interpolate(frame, size=(size, size), mode="area")[0].round().to(torch.uint8))
        if terminated or truncated:
            env.reset()
    env.close()
    return torch.stack(frames)


def replay_sampler(recipe, action_dim: int, steps: int, device):
    """() -> a [B, T] batch on ``device`` from TorchRL's slice-sampling replay of a random-action rollout
    of the recipe's primed env."""
    import torch
    from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

    train = recipe_train()
    b = recipe.replay_buffer
    env = train.make_primed_env(recipe, recipe.env.seed, train.latent_state_dim(recipe), action_dim)
    try:
        with torch.no_grad():
            rollout = env.rollout(steps, break_when_any_done=False)
    finally:
        env.close()
    if recipe.env.pixels_key is not None:
        size = recipe.env.image_size
        rollout["next", recipe.env.pixels_key] = rendered_frames(recipe.env.name, steps, size, recipe.env.seed)
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(steps), sampler=SliceSampler(slice_len=b.seq_len, end_key=("next", "done")),
        batch_size=b.batch_size * b.seq_len,
    )
    buffer.extend(rollout)
    return lambda: buffer.sample().reshape(b.batch_size, b.seq_len).to(device)


def torchrl_params(learner) -> dict[str, int]:
    """The recipe learner's parameters in harness.PARAM_ROWS' rows."""
    wm = learner.world_model  # encoder, RSSM rollout, decoder, reward head, continue head
    return {
        "encoder": count_params(wm[0]), "decoder": count_params(wm[2]),
        "rssm prior (GRU + prior head)": count_params(wm[1].rssm_prior),
        "rssm posterior": count_params(wm[1].rssm_posterior),
        "reward": count_params(wm[3]), "continue": count_params(wm[4]),
        "actor": count_params(learner.actor_loss.actor_model), "critic": count_params(learner.value_loss),
    }


def build_torchrl(spec: dict) -> Built:
    """The recipe's learner and stepper on ``spec["device"]``, from ``spec["recipe"]`` (``recipe_config``),
    built and warmed up as its train.py's main does, with our CUDA math (``spec["cuda_fast_math"]``, our
    config's cuda_fast_math: TF32 and cudnn.benchmark, set as our learner's process sets them; the recipe
    sets none of its own)."""
    import torch
    from omegaconf import OmegaConf

    from dreamer.system.device import configure_cuda_math

    device = torch.device(spec["device"])
    configure_cuda_math(device, spec.get("cuda_fast_math", True))  # before anything is built, as ours
    train = recipe_train()
    recipe = OmegaConf.create(spec["recipe"])
    torch.manual_seed(recipe.env.seed)
    proof_env = train.make_env(recipe, recipe.env.seed)
    obs_dim = 0 if recipe.env.vector_key is None else proof_env.observation_spec[recipe.env.vector_key].shape[-1]
    action_dim = proof_env.action_spec.shape[-1]
    proof_env.close()
    pixels_shape = None if recipe.env.pixels_key is None else (3, recipe.env.image_size, recipe.env.image_size)
    learner = train._build_learner(recipe, device, obs_dim, action_dim, pixels_shape, discrete=False)
    stepper = train._make_learner_update(recipe, device, learner)
    b = recipe.replay_buffer
    next_batch = replay_sampler(recipe, action_dim, spec.get("fill_steps") or max(4 * b.batch_size * b.seq_len, 1000),
                                device)
    warmup_s = None
    if train.resolve_compile_settings(recipe, device).enabled:
        # A replay sample of the timed shape (train.py warms up on zeros of it, from its env's specs).
        start = time.perf_counter()
        stepper.warmup(next_batch())
        warmup_s = time.perf_counter() - start
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return Built(lambda batch: stepper.step(None, batch), next_batch, torchrl_params(learner), warmup_s, sync,
                 math_flags())


def side_spec(overrides: list[str], *, compiled: bool, fill_steps: int | None = None) -> dict:
    """The spec of a TorchRL side (``kind`` torchrl) at our config ``overrides`` (device from them)."""
    cfg = compose(overrides)
    cuda = cfg.device.startswith("cuda")
    return {"kind": "torchrl", "recipe": recipe_config(cfg, compiled=compiled, cuda=cuda),
            "device": cfg.device if cuda else "cpu", "fill_steps": fill_steps, "cuda_fast_math": cfg.cuda_fast_math}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="our Hydra overrides, e.g. experiment=small")
    parser.add_argument("--compiled", action="store_true", help="compile (and on CUDA capture) the step")
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates first (default 2)")
    parser.add_argument("--reps", type=int, default=5, help="timed updates (default 5)")
    parser.add_argument("--fill-steps", type=int, help="random steps in its replay (default 4 batches, >= 1000)")
    args = parser.parse_args(argv)
    spec = side_spec(args.overrides, compiled=args.compiled, fill_steps=args.fill_steps)
    print("\n".join(describe(spec["recipe"])))
    side = build_torchrl(spec)
    print(f"parameters: {sum(side.params.values()):,} {side.params}")
    if side.compile_warmup_s is not None:
        print(f"compile warm-up {side.compile_warmup_s:.1f} s")
    timed = time_calls(side.update, side.next_batch, args.warmup, args.reps, side.sync)
    print(f"{timed['wall_s']:.4f} s per update (median of {args.reps}), {timed['cpu_s']:.4f} s process CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
