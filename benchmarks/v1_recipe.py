"""Learner: Dreamer V1 updates/s, ours vs TorchRL's installed V1 recipe, at one config.

Each side runs in its own process (as each would in training: its own
allocator state and settings), built for DMC cheetah-run from 64x64 pixels
with the same sizes (state 30, belief 200, hidden 400, 32 conv channels,
horizon 15) and the same batch (B sequences x T steps, fp32), its replay
buffer filled with the same synthetic trajectories in its own storage layout.
The parent then asks the sides for one timed update each in turn, so only one
side computes at a time:

- recipe: the update of ``sota-implementations/dreamer/dreamer.py``, built with
  its own ``dreamer_utils`` (``make_dreamer``, ``make_replay_buffer``) and the
  same losses, optimisers, ``compile_with_warmup`` of actor/value and
  ``clip_grad_norm_`` calls as its train loop: sample float32 sequences, world
  model, actor, value;
- ours: ``DreamerV1Learner.update(replay.sample())`` -- uint8 sequences,
  preprocessed on the device, the same three TorchRL losses, NHWC convs and
  ``torchrl_ext.MatmulObsDecoder`` (TorchRL's decoder, first layer as a matmul),
  host memory retained by malloc (``retain_host_memory``, as the app sets it);
  ``--with-nchw``, ``--with-deconv-decoder`` and ``--with-default-malloc`` add
  ours without each of those.

``speedup_vs_recipe`` is the median over repetitions of recipe_time / our_time,
each pair timed back to back (inside each side's process). ``compiled_vs_eager``
times our actor+value losses alone (forward+backward) compiled vs eager on the
same imagined latents. Prefetch is off on both sides so no background sampling
thread runs during another side's timing.

    python benchmarks/v1_recipe.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
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

from dreamer.algos.v1.learner import DreamerV1Learner
from dreamer.algos.v1.models import build_models
from dreamer.config import Config, DreamerV1Config, validate
from dreamer.data.replay import make_replay_buffer, write
from dreamer.envs.factory import close_env, make_env
from dreamer.envs.rendering import configure_mujoco_gl
from dreamer.system.memory import retain_freed_host_memory

# TorchRL's own Hydra config of the recipe (pytorch/rl sota-implementations/dreamer/config.yaml), which the
# torchrl wheel does not ship.
RECIPE_CONFIG = Path(__file__).with_name("v1_recipe_config.yaml")
TRAJECTORY = 500  # steps per synthetic episode (cheetah-run: 1000 frames / action repeat 2)
ACTION_DIM = 6


def recipe_dir() -> Path:
    import torchrl

    path = Path(torchrl.__file__).resolve().parent.parent / "sota-implementations" / "dreamer"
    if not (path / "dreamer_utils.py").exists():
        sys.exit(f"error: TorchRL's Dreamer recipe is not installed at {path}")
    return path


def recipe_utils():
    """The recipe's ``dreamer_utils`` module, imported from the installed torchrl's sota-implementations."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dreamer_utils", recipe_dir() / "dreamer_utils.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["dreamer_utils"] = module
    spec.loader.exec_module(module)
    return module


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
                 channels_last: bool = True, matmul_decoder: bool = True, retain_host_memory: bool = True):
        cfg = Config(algo=DreamerV1Config())
        cfg.algo.channels_last = channels_last
        cfg.retain_host_memory = retain_host_memory
        if cfg.retain_host_memory:  # as dreamer.run.build does at start
            retain_freed_host_memory()
        cfg.env.backend, cfg.env.name, cfg.env.from_pixels = "dm_control", "cheetah-run", True
        cfg.env.max_episode_steps = TRAJECTORY
        cfg.buffer.batch_size, cfg.buffer.batch_length = batch_size, batch_length
        cfg.buffer.capacity, cfg.buffer.prefetch = TRAJECTORY * len(episodes), 0
        cfg.compile.enabled = compile
        cfg.collector.num_workers = 0
        self.cfg = validate(cfg)
        device = torch.device("cpu")
        env = make_env(cfg.env, cfg.algo)
        self.models = build_models(cfg.algo, cfg.env, env, device)
        if not matmul_decoder:  # the same module and weights with TorchRL's forward: the before
            self.models.modules["decoder"].__class__ = ObsDecoder
        close_env(env)
        self.learner = DreamerV1Learner(
            self.cfg.algo, self.cfg.compile, self.models, device,
            batch_size=self.cfg.buffer.batch_size, batch_length=self.cfg.buffer.batch_length,
        )
        self.replay = make_replay_buffer(self.cfg.buffer, device)
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

    def compiled_vs_eager(self, reps: int) -> list[float]:
        """Eager / compiled seconds of actor+value forward+backward, per pair."""
        steps = {c: self.actor_value_step(compiled=c) for c in (True, False)}
        for step in steps.values():
            step()
        ratios = []
        for _ in range(reps):
            t_compiled, t_eager = timed(steps[True]), timed(steps[False])
            ratios.append(t_eager / t_compiled)
        return ratios

    def actor_value_step(self, compiled: bool):
        """A closure: our actor+value losses forward+backward on fixed latents."""
        learner = self.learner
        with torch.no_grad():
            _, latent = learner.world_model_loss(learner.prepare(self.replay.sample()))
        latent = learner.imagination_starts(latent)
        actor = learner.loss_fns["actor"] if compiled else learner.actor_loss
        value = learner.loss_fns["value"] if compiled else learner.value_loss

        def step():
            actor_td, imagined = actor(latent)
            actor_td["loss_actor"].backward()
            value_td, _ = value(imagined)
            value_td["loss_value"].backward()

        return step


# -- the recipe -------------------------------------------------------------------
class Recipe:
    """TorchRL's V1 recipe learner, built and stepped as its dreamer.py does."""

    def __init__(self, batch_size: int, batch_length: int, compile: bool, episodes: list[dict]):
        du = recipe_utils()  # the recipe's own helpers

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


# -- one process per side -----------------------------------------------------------
SIDES = {
    "recipe": lambda *a: Recipe(*a),
    "ours": lambda *a: Ours(*a),
    "ours_nchw": lambda *a: Ours(*a, channels_last=False),
    "ours_deconv": lambda *a: Ours(*a, matmul_decoder=False),
    "ours_default_malloc": lambda *a: Ours(*a, retain_host_memory=False),
}


def serve_side(conn, name: str, args: argparse.Namespace) -> None:
    """A side's process: build it, one steady-state update, then timings on request."""
    configure_mujoco_gl()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    episodes = [synthetic_episode(i, seed=i) for i in range(args.episodes)]
    side = SIDES[name](args.batch_size, args.batch_length, not args.no_compile, episodes)
    side.update()
    conn.send("ready")
    while (request := conn.recv()) != "stop":
        if request == "update":
            conn.send(timed(side.update))
        elif request == "compiled_vs_eager":
            conn.send(side.compiled_vs_eager(args.reps))


class SideProcess:
    # A side that says nothing for this long (building includes a cold compile) is hung.
    timeout_s = 1800

    def __init__(self, name: str, args: argparse.Namespace):
        self.name = name
        self.conn, child = mp.Pipe()
        self.proc = mp.get_context("spawn").Process(target=serve_side, args=(child, name, args), daemon=True)
        self.proc.start()
        child.close()  # the parent's copy: a dead side's end of the pipe then reads as EOF
        self.ask("built")

    def ask(self, request: str):
        try:
            if request != "built":
                self.conn.send(request)
            deadline = time.monotonic() + self.timeout_s
            while not self.conn.poll(5):
                if not self.proc.is_alive() or time.monotonic() > deadline:
                    break
            else:
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        self.proc.join(5)
        state = "hung" if self.proc.is_alive() else f"died (exit code {self.proc.exitcode})"
        sys.exit(f"error: the {self.name} side's process {state} on {request!r}")

    def stop(self) -> None:
        try:
            if self.proc.is_alive():
                self.conn.send("stop")
        except OSError:
            pass
        self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def _ratios(times: dict[str, list[float]], slower: str, faster: str) -> list[float]:
    return [a / b for a, b in zip(times[slower], times[faster])] if slower in times else []


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
    parser.add_argument("--with-default-malloc", action="store_true",
                        help="also time ours with retain_host_memory=false (key retain_vs_default_malloc)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.episodes < 1 or args.reps < 1:
        parser.error("--episodes and --reps must be >= 1")
    names = ["recipe", "ours"]
    for flag, name in ((args.with_nchw, "ours_nchw"), (args.with_deconv_decoder, "ours_deconv"),
                       (args.with_default_malloc, "ours_default_malloc")):
        if flag:
            names.append(name)
    sides = []
    try:
        for name in names:  # built one after another: compile warm-ups do not overlap
            sides.append(SideProcess(name, args))
        times: dict[str, list[float]] = {s.name: [] for s in sides}
        print(f"{'rep':>4} " + " ".join(f"{s.name + ' s':>11}" for s in sides) + f" {'recipe/ours':>12}")
        for rep in range(args.reps):
            for side in sides:
                times[side.name].append(side.ask("update"))
            print(f"{rep:>4} " + " ".join(f"{times[s.name][-1]:>11.3f}" for s in sides)
                  + f" {times['recipe'][-1] / times['ours'][-1]:>12.2f}")
        compiled_ratios = [] if args.no_compile else sides[1].ask("compiled_vs_eager")
    finally:
        for side in sides:
            side.stop()

    def median(values):
        return statistics.median(values) if values else None

    ratios = _ratios(times, "recipe", "ours")
    extra = {key: _ratios(times, name, "ours") for key, name in (
        ("nhwc_vs_nchw", "ours_nchw"), ("matmul_decoder_vs_deconv", "ours_deconv"),
        ("retain_vs_default_malloc", "ours_default_malloc"))}
    result = {
        "config": {"batch_size": args.batch_size, "batch_length": args.batch_length, "threads": args.threads,
                   "compile": not args.no_compile, "reps": args.reps},
        "recipe_update_s": median(times["recipe"]),
        "ours_update_s": median(times["ours"]),
        "recipe_updates_per_s": 1 / median(times["recipe"]),
        "ours_updates_per_s": 1 / median(times["ours"]),
        "speedup_vs_recipe": median(ratios),
        "speedup_vs_recipe_per_pair": ratios,
        "compiled_vs_eager": median(compiled_ratios),
        "compiled_vs_eager_per_pair": compiled_ratios,
        **{k: median(v) for k, v in extra.items()},
        **{f"{k}_per_pair": v for k, v in extra.items()},
    }
    print(f"\nmedian update: recipe {result['recipe_update_s']:.3f} s, ours {result['ours_update_s']:.3f} s")
    print(f"speedup_vs_recipe (median of pair ratios): {result['speedup_vs_recipe']:.2f}")
    for key, values in extra.items():
        if values:
            print(f"{key} (ours with vs without it, median of pairs): {median(values):.2f}")
    if compiled_ratios:
        print(f"compiled_vs_eager, actor+value fwd+bwd: {result['compiled_vs_eager']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
