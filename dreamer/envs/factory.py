"""Environment factory: gymnasium, dm_control and Atari (ALE), one TorchRL env each.

Every env leaves here with the same contract, whatever its backend:
- observation under ``"pixels"`` (uint8, (H, W, C), H = W = env.render_size) or
  ``"observation"`` (float32 vector);
- action repeat and an episode limit (``max_episode_steps`` agent steps,
  truncation);
- ``"state"`` / ``"belief"`` zeros at reset (the recurrent policy's carry);
- ``"episode_reward"`` (running return) for evaluation.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Callable

import gymnasium
import torch
from torchrl.data import Unbounded
from torchrl.envs import (
    CatTensors,
    Compose,
    DoubleToFloat,
    EnvBase,
    RewardSum,
    SerialEnv,
    StepCounter,
    TensorDictPrimer,
    Transform,
    TransformedEnv,
)

from dreamer.config import AlgoConfig, EnvConfig
from dreamer.envs.keys import PIXELS_KEY, VECTOR_KEY, observation_key
from dreamer.envs.rendering import configure_mujoco_gl
from dreamer.envs.wrappers import AtariNoopStart, DownsampleUInt8
from dreamer.errors import UserError


def available_env_names(backend: str) -> list[str]:
    """Every env name ``backend`` knows here (what env.name may be), sorted."""
    if backend == "gymnasium":
        return sorted(k for k in gymnasium.registry if "/" not in k)
    if backend == "dm_control":
        configure_mujoco_gl()
        from dm_control import suite

        return sorted(f"{d}-{t}" for d, t in suite.ALL_TASKS)
    import ale_py

    gymnasium.register_envs(ale_py)
    return sorted(
        k[len("ALE/"):-len("-v5")] for k in gymnasium.registry if k.startswith("ALE/") and k.endswith("-v5")
    )


def _unknown(env_cfg: EnvConfig) -> UserError:
    names = available_env_names(env_cfg.backend)
    imported = f" (env.import={env_cfg.import_} did not register it)" if env_cfg.import_ else ""
    return UserError(
        f"unknown {env_cfg.backend} env {env_cfg.name!r}{imported}; available: {', '.join(names)}"
    )


def import_env_module(env_cfg: EnvConfig) -> None:
    """Import ``env.import`` (a user module that calls gymnasium.register).

    make_env calls this first, so every process that builds an env imports it:
    the main process and each spawned collector worker, a fresh interpreter
    that has not seen the main process's imports.
    """
    module = env_cfg.import_
    if not module:
        return
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise UserError(
            f"env.import={module}: cannot import it ({err}); put the module on PYTHONPATH "
            "(or run from the directory holding it) or fix the name"
        ) from None


def _require(module: str, extra_hint: str) -> None:
    try:
        __import__(module)
    except ImportError as err:
        raise UserError(f"{module} is not installed ({err}); {extra_hint}") from None


def _base_env(env_cfg: EnvConfig, device: torch.device, pixels: bool, pixels_only: bool) -> EnvBase:
    if env_cfg.backend == "gymnasium":
        if pixels:
            # Classic control renders through pygame/SDL: no display, no audio here.
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        from torchrl.envs import GymEnv, GymWrapper

        if env_cfg.name not in gymnasium.registry:
            raise _unknown(env_cfg)
        if not pixels:
            return GymEnv(env_cfg.name, frame_skip=env_cfg.action_repeat, device=device)
        from dreamer.envs.action_repeat import GymActionRepeat

        # Repeat below the render wrapper: one frame drawn per agent step, not per repeat.
        repeated = GymActionRepeat(gymnasium.make(env_cfg.name, render_mode="rgb_array"), env_cfg.action_repeat)
        return GymWrapper(repeated, from_pixels=True, pixels_only=pixels_only, device=device)
    if env_cfg.backend == "dm_control":
        configure_mujoco_gl()
        _require("dm_control", "install the extra: pip install 'dreamer[dmc]' (in a checkout: pip install -e '.[dmc]')")
        from dm_control import suite
        from torchrl.envs import DMControlWrapper

        domain, _, task = env_cfg.name.partition("-")
        task = task.replace("-", "_")
        if (domain, task) not in suite.ALL_TASKS:
            raise _unknown(env_cfg)
        if not pixels:
            return DMControlWrapper(suite.load(domain, task), frame_skip=env_cfg.action_repeat, device=device)
        from dm_control.suite.wrappers import pixels as dm_pixels

        from dreamer.envs.action_repeat import DMControlActionRepeat

        # Built by hand: DMControlEnv forwards render_kwargs to the task constructor
        # (TypeError), and its frame_skip renders every repeat. Here the action
        # repeats below the pixel wrapper, so one frame is drawn per agent step, at
        # the stored size (cheaper than rendering larger and resizing).
        rendered = dm_pixels.Wrapper(
            DMControlActionRepeat(suite.load(domain, task), env_cfg.action_repeat),
            pixels_only=pixels_only,
            render_kwargs={"height": env_cfg.render_size, "width": env_cfg.render_size, "camera_id": 0},
        )
        return DMControlWrapper(rendered, device=device)
    _require("ale_py", "install the extra: pip install 'dreamer[atari]' (in a checkout: pip install -e '.[atari]')")
    import ale_py
    from torchrl.envs import GymWrapper

    gymnasium.register_envs(ale_py)
    game = env_cfg.name
    env_id = f"ALE/{game}-v5"
    if env_id not in gymnasium.registry:
        raise _unknown(env_cfg)
    atari = gymnasium.make(
        env_id,
        frameskip=env_cfg.action_repeat,
        repeat_action_probability=env_cfg.sticky_action_prob,
        full_action_space=False,
    )
    if env_cfg.noop_max:
        atari = AtariNoopStart(atari, env_cfg.noop_max)
    return GymWrapper(atari, categorical_action_encoding=False, device=device)  # one-hot actions


def make_env(
    env_cfg: EnvConfig,
    algo_cfg: AlgoConfig,
    *,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    record_pixels: bool = False,
) -> TransformedEnv:
    """One environment with the contract described in the module docstring.

    ``algo_cfg`` (the ``algo`` section) sizes the policy's carry: ``"state"``
    is its ``latent_state_dim``, ``"belief"`` its ``rssm_hidden_dim``, derived
    here once for every caller. ``record_pixels`` adds uint8 frames to a
    state-observation env (for videos); pixel envs always have them.
    """
    state_dim, belief_dim = algo_cfg.latent_state_dim, algo_cfg.rssm_hidden_dim
    import_env_module(env_cfg)
    device = torch.device(device)
    obs_key = observation_key(env_cfg)
    pixels = obs_key == PIXELS_KEY or record_pixels
    base = _base_env(env_cfg, device, pixels, pixels_only=obs_key == PIXELS_KEY)
    transforms: list[Transform] = []
    if pixels:
        frame_shape = base.observation_spec[PIXELS_KEY].shape
        if tuple(frame_shape[-3:-1]) != (env_cfg.render_size, env_cfg.render_size):
            transforms.append(DownsampleUInt8(env_cfg.render_size))
    # dm_control speaks float64 (observations, actions, rewards); the networks float32.
    transforms.append(DoubleToFloat())
    if obs_key == VECTOR_KEY:
        vector_keys = [k for k in base.observation_spec.keys() if k != PIXELS_KEY]
        if vector_keys != [VECTOR_KEY]:
            # dm_control splits its state (position, velocity, ...): one flat vector.
            transforms.append(
                CatTensors(in_keys=sorted(vector_keys), out_key=VECTOR_KEY, del_keys=True)
            )
    transforms += [
        StepCounter(max_steps=env_cfg.max_episode_steps),
        RewardSum(),
        TensorDictPrimer(
            state=Unbounded(shape=(state_dim,), device=device),
            belief=Unbounded(shape=(belief_dim,), device=device),
            random=False,
            default_value=0.0,
        ),
    ]
    env = TransformedEnv(base, Compose(*transforms))
    if seed is not None:
        env.set_seed(seed)
    return env


def env_factory(env_cfg: EnvConfig, algo_cfg: AlgoConfig, *, seed: int) -> Callable[[], EnvBase]:
    """A picklable zero-argument constructor, for spawned collector workers."""
    return functools.partial(make_env, env_cfg, algo_cfg, seed=seed)


# The most envs one evaluation steps together: more episodes take more rollouts.
# Bounds the evaluation's memory (a dm_control pixel env holds its own render context).
EVAL_ENVS_MAX = 16


def make_eval_env(
    env_cfg: EnvConfig, algo_cfg: AlgoConfig, *, episodes: int, seed: int, record_pixels: bool = False
) -> SerialEnv:
    """One env per evaluation episode (at most ``EVAL_ENVS_MAX``, the episodes
    then shared evenly between rollouts; seeds ``seed``, ``seed + 1``, ...)
    stepped together in this process: the evaluation's policy acts on all of
    them at once instead of once per episode per step."""
    rollouts = -(-episodes // EVAL_ENVS_MAX)
    envs = -(-episodes // rollouts)  # 20 episodes: 2 rollouts of 10, not 16 and 16 (12 played for nothing)
    # One constructor, the seeds as its arguments: TorchRL then builds one env (not one per
    # seed) to read the specs from, and the batch is built at its first reset.
    return SerialEnv(envs, functools.partial(make_env, env_cfg, algo_cfg, record_pixels=record_pixels),
                     create_env_kwargs=[{"seed": seed + i} for i in range(envs)])


def close_env(env: EnvBase) -> None:
    """Close an env (or a batch of them), freeing dm_control's GL contexts first.

    A dm_control pixel env that is merely closed leaves its rendering contexts
    to the cyclic garbage collector, whose finaliser can deadlock the process
    (osmesa: every time). Freeing the physics releases them here, in order.
    """
    if isinstance(env, SerialEnv) and env.is_closed:
        return  # never started: it built no env (a SerialEnv starts at its first reset)
    for single in env._envs if isinstance(env, SerialEnv) else [env]:
        base = getattr(single, "base_env", single)
        physics = getattr(getattr(base, "_env", None), "physics", None)
        if physics is not None and callable(getattr(physics, "free", None)):
            physics.free()
    env.close()


def is_discrete(env: EnvBase) -> bool:
    from torchrl.data import OneHot

    return isinstance(env.action_spec, OneHot)
