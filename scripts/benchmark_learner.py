"""Learner: Dreamer V1 updates/s, ours vs TorchRL's installed V1 recipe, at one config.

One process builds both learners for DMC cheetah-run from 64x64 pixels with
the same sizes (state 30, belief 200, hidden 400, 32 conv channels, horizon
15) and the same batch (B sequences x T steps, fp32), fills each one's replay
buffer with the same synthetic trajectories in its own storage layout, and
then alternates their update steps:

- recipe: the update of ``sota-implementations/dreamer/dreamer.py``, built with
  its own ``dreamer_utils`` (``make_dreamer``, ``make_replay_buffer``) and the
  same losses, optimisers, ``compile_with_warmup`` of actor/value and
  ``clip_grad_norm_`` calls as its train loop: sample float32 sequences, world
  model, actor, value;
- ours: ``DreamerV1Learner.update(replay.sample())`` -- uint8 sequences,
  preprocessed on the device, the same three TorchRL losses, NHWC convs and
  ``torchrl_ext.MatmulObsDecoder`` (TorchRL's decoder, first layer as a matmul);
  ``--with-nchw`` and ``--with-deconv-decoder`` add ours without each of those.

``speedup_vs_recipe`` is the median over repetitions of recipe_time / our_time,
each pair timed back to back. ``compiled_vs_eager`` times our actor+value
losses alone (forward+backward) compiled vs eager on the same imagined
latents. Prefetch is off on both sides so neither one's background sampling
thread runs during the other's timing.

    python scripts/benchmark_learner.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from tensordict import TensorDict
from torchrl.envs.transforms import ObservationTransform, Resize
from torchrl.modules import ObsDecoder

from dreamer.config import Config, validate
from dreamer.envs import close_env, configure_mujoco_gl, make_env
from dreamer.learner import DreamerV1Learner
from dreamer.models import build_models
from dreamer.replay import make_replay_buffer, write

REPO = Path(__file__).resolve().parents[1]
RECIPE_CONFIG = REPO.parent / "shared" / "reference" / "torchrl-dreamer-v1-config.yaml"
TRAJECTORY = 500  # steps per synthetic episode (cheetah-run: 1000 frames / action repeat 2)
ACTION_DIM = 6


def recipe_dir() -> Path:
    import torchrl

    path = Path(torchrl.__file__).resolve().parent.parent / "sota-implementations" / "dreamer"
    if not (path / "dreamer_utils.py").exists():
        sys.exit(f"error: TorchRL's Dreamer recipe is not installed at {path}")
    return path


class _TorchResize(Resize):
    """torchvision's resize (what ``Resize`` calls) as F.interpolate: torchvision
    does not load beside torch 2.13's CPU build, and the recipe's CPU env
    setup needs a Resize to build its proof environment (specs only)."""

    def __init__(self, w, h=None, interpolation="bilinear", in_keys=None, out_keys=None):
        ObservationTransform.__init__(self, in_keys=in_keys or ["pixels"], out_keys=out_keys or in_keys or ["pixels"])
        self.w, self.h, self.interpolation = int(w), int(h or w), interpolation

    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        lead = observation.shape[:-3]
        flat = observation.reshape(-1, *observation.shape[-3:])
        out = F.interpolate(flat, size=(self.h, self.w), mode=self.interpolation, antialias=True)
        return out.reshape(*lead, *out.shape[-3:])


def synthetic_episode(traj_id: int, seed: int) -> dict:
    """Frames, actions and rewards of one episode, shared by both layouts."""
    g = torch.Generator().manual_seed(seed)
    return {
        "frames": torch.randint(0, 256, (TRAJECTORY + 1, 64, 64, 3), dtype=torch.uint8, generator=g),
        "action": torch.rand(TRAJECTORY, ACTION_DIM, generator=g) * 2 - 1,
        "reward": torch.rand(TRAJECTORY, 1, generator=g),
        "traj_id": traj_id,
    }


def _flags(steps: int) -> dict:
    false = torch.zeros(steps, 1, dtype=torch.bool)
    return {"done": false, "terminated": false.clone(), "truncated": false.clone()}


# -- ours -------------------------------------------------------------------------
class Ours:
    def __init__(self, batch_size: int, batch_length: int, compile: bool, episodes: list[dict],
                 channels_last: bool = True, matmul_decoder: bool = True):
        self.name = "ours" if channels_last else "ours_nchw"
        if not matmul_decoder:
            self.name = "ours_deconv"
        cfg = Config()
        cfg.channels_last = channels_last
        cfg.env.backend, cfg.env.name, cfg.env.from_pixels = "dm_control", "cheetah-run", True
        cfg.env.max_episode_steps = TRAJECTORY
        cfg.buffer.batch_size, cfg.buffer.batch_length = batch_size, batch_length
        cfg.buffer.capacity, cfg.buffer.prefetch = TRAJECTORY * len(episodes), 0
        cfg.compile.enabled = compile
        cfg.collector.num_workers = 0
        self.cfg = validate(cfg)
        device = torch.device("cpu")
        env = make_env(cfg.env, state_dim=cfg.algo.state_dim, belief_dim=cfg.algo.rssm_hidden_dim)
        self.models = build_models(cfg, env, device)
        if not matmul_decoder:  # the same module and weights with TorchRL's forward: the before
            self.models.modules["decoder"].__class__ = ObsDecoder
        close_env(env)
        self.learner = DreamerV1Learner(self.cfg, self.models, device)
        self.replay = make_replay_buffer(self.cfg, device)
        for ep in episodes:
            steps = TRAJECTORY
            write(self.replay, TensorDict({
                "action": ep["action"],
                "step_count": torch.arange(steps).unsqueeze(-1),
                "collector": {"traj_ids": torch.full((steps,), ep["traj_id"])},
                "next": {"pixels": ep["frames"][1:], "reward": ep["reward"], **_flags(steps)},
            }, [steps]), "pixels")
        self.learner.compile()
        self.learner.warmup(self.replay.sample())

    def update(self) -> None:
        self.learner.update(self.replay.sample())

    def actor_value_step(self, compiled: bool):
        """A closure: our actor+value losses forward+backward on fixed latents."""
        learner = self.learner
        with torch.no_grad():
            _, latent = learner.world_model_loss(learner.prepare(self.replay.sample()))
        latent = latent.reshape(-1)
        actor = learner._actor_loss_fn if compiled else learner.actor_loss
        value = learner._value_loss_fn if compiled else learner.value_loss

        def step():
            actor_td, imagined = actor(latent)
            actor_td["loss_actor"].backward()
            value_td, _ = value(imagined)
            value_td["loss_value"].backward()

        return step


# -- the recipe -------------------------------------------------------------------
class Recipe:
    """TorchRL's V1 recipe learner, built and stepped as its dreamer.py does."""

    name = "recipe"

    def __init__(self, batch_size: int, batch_length: int, compile: bool, episodes: list[dict]):
        sys.path.insert(0, str(recipe_dir()))
        import dreamer_utils as du  # the recipe's own helpers

        du.Resize = _TorchResize
        from torch.nn.utils import clip_grad_norm_
        from torchrl._utils import compile_with_warmup
        from torchrl.objectives.dreamer import DreamerActorLoss, DreamerModelLoss, DreamerValueLoss

        cfg = OmegaConf.load(RECIPE_CONFIG)
        cfg.env.name, cfg.env.task, cfg.env.from_pixels, cfg.env.image_size = "cheetah", "run", True, 64
        cfg.env.horizon = TRAJECTORY
        cfg.networks.device = "cpu"
        cfg.optimization.autocast = False  # fp32, as ours (bf16 autocast never finished a step here)
        cfg.optimization.compile.enabled = compile
        cfg.replay_buffer.batch_size = batch_size * batch_length  # steps per sample
        cfg.replay_buffer.batch_length = batch_length
        cfg.logger.video = False
        self.cfg, self.batch_length = cfg, batch_length
        device = torch.device("cpu")
        test_env = du.transform_env(cfg, du._make_env(cfg, device="cpu"))
        (world_model, model_based_env, _, actor_model, value_model, _) = du.make_dreamer(
            cfg=cfg, device=device, test_env=test_env, use_decoder_in_env=False
        )
        close_env(test_env)
        self.world_model_loss = DreamerModelLoss(world_model)
        self.actor_loss = DreamerActorLoss(
            actor_model, value_model, model_based_env,
            imagination_horizon=cfg.optimization.imagination_horizon, discount_loss=True,
        )
        self.actor_loss.make_value_estimator(gamma=cfg.optimization.gamma, lmbda=cfg.optimization.lmbda)
        self.value_loss = DreamerValueLoss(value_model, discount_loss=True, gamma=cfg.optimization.gamma)
        opt = cfg.optimization
        self.opts = [
            torch.optim.Adam(world_model.parameters(), lr=opt.world_model_lr, fused=False),
            torch.optim.Adam(actor_model.parameters(), lr=opt.actor_lr, fused=False),
            torch.optim.Adam(value_model.parameters(), lr=opt.value_lr, fused=False),
        ]
        self.params = [list(world_model.parameters()), list(actor_model.parameters()),
                       list(value_model.parameters())]
        self.clip, self.grad_clip = clip_grad_norm_, opt.grad_clip
        if compile:
            torch._dynamo.config.capture_scalar_outputs = True
            options = {"triton.cudagraphs": opt.compile.cudagraphs}
            kwargs = dict(backend=opt.compile.backend, fullgraph=False, warmup=3, options=options)
            self.actor_loss = compile_with_warmup(self.actor_loss, **kwargs)
            self.value_loss = compile_with_warmup(self.value_loss, **kwargs)
        self.replay = du.make_replay_buffer(
            batch_size=cfg.replay_buffer.batch_size, batch_seq_len=batch_length,
            buffer_size=TRAJECTORY * len(episodes), device=device, prefetch=0,
            pixel_obs=True, grayscale=False, image_size=64,
        )
        for ep in episodes:  # its stored layout: float32 frames, root and next
            pixels = ep["frames"].permute(0, 3, 1, 2).float() / 255
            steps = TRAJECTORY
            self.replay.extend(TensorDict({
                "pixels": pixels[:-1],
                "action": ep["action"],
                "state": torch.zeros(steps, cfg.networks.state_dim),
                "belief": torch.zeros(steps, cfg.networks.rssm_hidden_dim),
                "collector": {"traj_ids": torch.full((steps,), ep["traj_id"])},
                "next": {"pixels": pixels[1:], "reward": ep["reward"], **_flags(steps)},
            }, [steps]).unsqueeze(0))  # its storage is 2-D: (time, env)
        for _ in range(4 if compile else 1):  # compile_with_warmup compiles after 3 eager calls
            self.update()

    def _step(self, i: int, loss: torch.Tensor) -> None:
        self.opts[i].zero_grad()
        loss.backward()
        self.clip(self.params[i], self.grad_clip)
        self.opts[i].step()

    def update(self) -> None:
        data = self.replay.sample().reshape(-1, self.batch_length)
        model_td, data = self.world_model_loss(data)
        self._step(0, model_td["loss_model_kl"] + model_td["loss_model_reco"] + model_td["loss_model_reward"])
        actor_td, data = self.actor_loss(data.reshape(-1))
        self._step(1, actor_td["loss_actor"])
        value_td, data = self.value_loss(data)
        self._step(2, value_td["loss_value"])


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per update")
    parser.add_argument("--batch-length", type=int, default=50, help="steps per sequence")
    parser.add_argument("--reps", type=int, default=5, help="timed update pairs (after warm-up)")
    parser.add_argument("--episodes", type=int, default=4, help="synthetic episodes in each buffer")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--no-compile", action="store_true", help="both sides eager")
    parser.add_argument("--with-nchw", action="store_true",
                        help="also time ours with channels_last=false (key nhwc_vs_nchw)")
    parser.add_argument("--with-deconv-decoder", action="store_true",
                        help="also time ours with TorchRL's ObsDecoder instead of MatmulObsDecoder "
                             "(key matmul_decoder_vs_deconv)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    configure_mujoco_gl()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    compile = not args.no_compile
    episodes = [synthetic_episode(i, seed=i) for i in range(args.episodes)]
    sides = [Recipe(args.batch_size, args.batch_length, compile, episodes),
             Ours(args.batch_size, args.batch_length, compile, episodes)]
    if args.with_nchw:
        sides.append(Ours(args.batch_size, args.batch_length, compile, episodes, channels_last=False))
    if args.with_deconv_decoder:
        sides.append(Ours(args.batch_size, args.batch_length, compile, episodes, matmul_decoder=False))
    ours = sides[1]
    for side in sides:  # one steady-state update each before timing
        side.update()

    times: dict[str, list[float]] = {s.name: [] for s in sides}
    ratios, nhwc_ratios, decoder_ratios = [], [], []
    print(f"{'rep':>4} " + " ".join(f"{s.name + ' s':>11}" for s in sides) + f" {'recipe/ours':>12}")
    for rep in range(args.reps):
        pair = {s.name: timed(s.update) for s in sides}
        for name, t in pair.items():
            times[name].append(t)
        ratios.append(pair["recipe"] / pair["ours"])
        if "ours_nchw" in pair:
            nhwc_ratios.append(pair["ours_nchw"] / pair["ours"])
        if "ours_deconv" in pair:
            decoder_ratios.append(pair["ours_deconv"] / pair["ours"])
        print(f"{rep:>4} " + " ".join(f"{t:>11.3f}" for t in pair.values()) + f" {ratios[-1]:>12.2f}")

    compiled_ratios = []
    if compile:
        steps = {c: ours.actor_value_step(compiled=c) for c in (True, False)}
        for step in steps.values():
            step()
        for _ in range(args.reps):
            t_compiled, t_eager = timed(steps[True]), timed(steps[False])
            compiled_ratios.append(t_eager / t_compiled)

    result = {
        "config": {"batch_size": args.batch_size, "batch_length": args.batch_length, "threads": args.threads,
                   "compile": compile, "reps": args.reps},
        "recipe_update_s": statistics.median(times["recipe"]),
        "ours_update_s": statistics.median(times["ours"]),
        "recipe_updates_per_s": 1 / statistics.median(times["recipe"]),
        "ours_updates_per_s": 1 / statistics.median(times["ours"]),
        "speedup_vs_recipe": statistics.median(ratios),
        "speedup_vs_recipe_per_pair": ratios,
        "compiled_vs_eager": statistics.median(compiled_ratios) if compiled_ratios else None,
        "compiled_vs_eager_per_pair": compiled_ratios,
        "nhwc_vs_nchw": statistics.median(nhwc_ratios) if nhwc_ratios else None,
        "nhwc_vs_nchw_per_pair": nhwc_ratios,
        "matmul_decoder_vs_deconv": statistics.median(decoder_ratios) if decoder_ratios else None,
        "matmul_decoder_vs_deconv_per_pair": decoder_ratios,
    }
    print(f"\nmedian update: recipe {result['recipe_update_s']:.3f} s, ours {result['ours_update_s']:.3f} s")
    print(f"speedup_vs_recipe (median of pair ratios): {result['speedup_vs_recipe']:.2f}")
    if nhwc_ratios:
        print(f"nhwc_vs_nchw (ours, channels_last on vs off): {result['nhwc_vs_nchw']:.2f}")
    if decoder_ratios:
        print(f"matmul_decoder_vs_deconv (ours, MatmulObsDecoder vs TorchRL's ObsDecoder): "
              f"{result['matmul_decoder_vs_deconv']:.2f}")
    if compiled_ratios:
        print(f"compiled_vs_eager, actor+value fwd+bwd: {result['compiled_vs_eager']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
