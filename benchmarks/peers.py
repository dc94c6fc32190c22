"""Seconds per DreamerV3 update: ours against sheeprl 0.8.4's DreamerV3 (`dreamer_v3_5`) and TorchRL's own
DreamerV3 stepper, side by side.

    python benchmarks/peers.py --rounds 3 --reps 5 --json out.json     # both configs, every side
    python benchmarks/peers.py --configs pendulum --sides ours sheeprl
    python benchmarks/peers.py --sides ours torchrl                    # without sheeprl installed
    python benchmarks/peers.py --sheeprl-python ~/venv-peers/bin/python  # sheeprl in its own venv

sheeprl comes from the `peers` extra, installed with torch held at ours:
`echo torch==2.13.0 > FILE && pip install -c FILE '.[peers]'` (README, "Against peers"). TorchRL's
stepper and its recipe come with the torchrl we install.

Configs (ours, then each peer mapped onto the same compute; the table printed at start lists every
setting that changes compute, and the parameter counts of every side module by module):
  pendulum  experiment=small algo.actor_grad=reinforce (V3, 64 units, GRU 64 in 8 blocks, 16x16 latents,
            batch 16x16)
  size1m    experiment=gym_state_v3 algo.actor_grad=reinforce (size1m, batch 16x64)
Both on Pendulum-v1's 3-d state, fp32, --threads threads. Extra Hydra overrides for ours (--overrides) are
mapped onto the peers too, since the mappings are read from our composed config.

Sides, each in its own process (built one after another, so no compile warm-up overlaps another side's
work):
  sheeprl           its `train(...)` (world model, imagination, actor and critic losses, one backward, LaProp
                    step, metrics aggregator) and `update_target_critic(...)`, the calls its main loop makes
                    per update, on [T, B] windows of a random-action Pendulum-v1 rollout; eager.
  torchrl_eager     `DreamerV3OptimizationStepper.step` as TorchRL's recipe builds it (its `_build_learner` /
                    `_make_learner_update`; benchmarks/torchrl_v3.py) on its own replay of a random-action
                    rollout; optimization.compile=off.
  torchrl_compiled  the same with its whole-step compile (the RSSM as a higher-order scan); its compile
                    warm-up is reported apart (cold: a fresh inductor cache dir).
  ours_eager        `learner.update(replay.sample())` (benchmarks/harness.py's `compose`/`build`),
                    compile.enabled=false.
  ours_compiled     our compiled-losses path: compile.enabled=true (+ --compiled-overrides: the best settings); its
                    compile warm-up (cold: a fresh inductor cache dir unless --compile-cache-dir) reported apart.
  ours_whole        our whole update as one compiled function (compile.update=whole, harness.UPDATE_PATH_KEY);
                    skipped, with a line, where the config schema has no such key yet.
"Ours as shipped" is whichever of ours the preset's own compile settings pick. --sides ours means all of ours,
torchrl both of TorchRL's.

Each round asks every side in turn (the order reversed every other round) for --warmup untimed updates
then --reps timed ones, and keeps their median; a side's figure is the median over rounds, and a
speedup is the median over rounds of the per-round ratio peer_s / ours_s (measured side by side).
Keys in --json, per config (pendulum, size1m): speedup_vs_sheeprl_<config> (ours as shipped), the same with
_eager and _compiled; speedup_vs_torchrl_<config> (ours as shipped against torchrl_compiled), _eager
(ours_eager against torchrl_eager), _compiled and _whole (ours_compiled, ours_whole against torchrl_compiled);
and under "configs" each config's mappings, parameter counts, medians (<side>_s, <side>_cpu_s,
ours_shipped_s), compile warm-ups and the per-round figures. A speedup whose sides did not run is null;
"skipped" says why a side did not run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torchrl_v3
from harness import (
    PARAM_ROWS,
    Built,
    SideFailed,
    SideProcess,
    build_ours,
    compose,
    count_params,
    serve,
    shipped_update_path,
    update_path_overrides,
    write_report,
)

SCRIPT = Path(__file__).resolve()
SHEEPRL_VERSION = "0.8.4"
INSTALL_HINT = (
    f"sheeprl=={SHEEPRL_VERSION} is not importable{{where}}: install it with torch held, "
    "`echo torch==2.13.0 > FILE && pip install -c FILE '.[peers]'`, or pass --sheeprl-python "
    "a Python that has it{alternative}"
)
PRESETS = {
    "pendulum": ["experiment=small", "algo.actor_grad=reinforce"],
    "size1m": ["experiment=gym_state_v3", "algo.actor_grad=reinforce"],
}
SIDES = ("sheeprl", "torchrl_eager", "torchrl_compiled", "ours_eager", "ours_compiled", "ours_whole")
GROUPS = {"ours": ("ours_eager", "ours_compiled", "ours_whole"), "torchrl": ("torchrl_eager", "torchrl_compiled")}
# Our update path (harness.shipped_update_path) -> the side that runs it.
PATH_SIDES = {"eager": "ours_eager", "losses": "ours_compiled", "whole": "ours_whole"}
# A side that says nothing for this long (a cold compile warm-up included) is hung.
SIDE_TIMEOUT_S = 1800


# -- the config mapping ------------------------------------------------------------------------------
@dataclass
class Mapped:
    """One setting that changes compute: ours (as composed) and how sheeprl is set to match."""
    setting: str
    ours: str
    sheeprl: list[str]  # Hydra overrides of sheeprl's config
    note: str = ""


def mapping(cfg, threads: int) -> list[Mapped]:
    """Every compute-relevant setting of our composed config, mapped onto sheeprl's dreamer_v3_5."""
    a, b, e = cfg.algo, cfg.buffer, cfg.env
    if a.name != "dreamer_v3" or e.from_pixels or e.backend != "gymnasium":
        raise SystemExit("error: the peer benchmark maps DreamerV3 on a gymnasium state env only")
    wm = "algo.world_model"
    layers = [f"{wm}.{part}.mlp_layers={a.mlp_layers}"
              for part in ("encoder", "observation_model", "reward_model", "discount_model")]
    replay_value = a.replay_value_scale > 0
    return [
        Mapped("algorithm", "algo=dreamer_v3 (TorchRL's V3 losses and modules)", ["exp=dreamer_v3_5"],
               "the Nature-paper DreamerV3"),
        Mapped("environment", f"env.name={e.name} (state vector; CNN off)",
               ["env=gym", f"env.id={e.name}", "algo.cnn_keys.encoder=[]", "algo.mlp_keys.encoder=[state]"]),
        Mapped("batch", f"buffer.batch_size={b.batch_size} buffer.batch_length={b.batch_length}",
               [f"algo.per_rank_batch_size={b.batch_size}", f"algo.per_rank_sequence_length={b.batch_length}",
                "algo.replay_context=0"], "every sequence starts from zeros on both sides"),
        Mapped("MLP units", f"algo.hidden_dim={a.hidden_dim}", [f"algo.dense_units={a.hidden_dim}"],
               "encoder, decoder, reward, continue, actor, critic"),
        Mapped("MLP layers", f"algo.mlp_layers={a.mlp_layers}",
               [*layers, f"algo.actor.mlp_layers={a.mlp_layers}", f"algo.critic.mlp_layers={a.mlp_layers}"]),
        Mapped("recurrent state", f"algo.rssm_hidden_dim={a.rssm_hidden_dim}",
               [f"{wm}.recurrent_model.recurrent_state_size={a.rssm_hidden_dim}"]),
        Mapped("GRU input projections, prior/posterior hidden", f"algo.hidden_dim={a.hidden_dim}",
               [f"{wm}.recurrent_model.hidden_size={a.hidden_dim}"],
               "sheeprl's transition/representation hidden_size follow it"),
        Mapped("block GRU", f"algo.gru_blocks={a.gru_blocks}, 1 block layer before the gates (TorchRL's)",
               [f"{wm}.recurrent_model.blocks={a.gru_blocks}", f"{wm}.recurrent_model.dynamics_layers=1"]),
        Mapped("prior head", "2 hidden layers (TorchRL's RSSMPriorV3)", [f"{wm}.transition_model.layers=2"]),
        Mapped("posterior head", "1 hidden layer (TorchRL's RSSMPosteriorV3)",
               [f"{wm}.representation_model.layers=1"]),
        Mapped("latents", f"algo.num_categoricals={a.num_categoricals} algo.num_classes={a.num_classes}",
               [f"{wm}.stochastic_size={a.num_categoricals}", f"{wm}.discrete_size={a.num_classes}"]),
        Mapped("unimix", f"algo.unimix={a.unimix}", [f"{wm}.unimix={a.unimix}"]),
        Mapped("two-hot bins", f"algo.num_bins={a.num_bins}",
               [f"{wm}.reward_model.bins={a.num_bins}", f"algo.critic.bins={a.num_bins}"]),
        Mapped("imagination", f"algo.imagination_horizon={a.imagination_horizon} from every replayed state",
               [f"algo.horizon={a.imagination_horizon}"], "sheeprl imagines from every replayed state too"),
        Mapped("returns", f"algo.gamma={a.gamma} algo.lmbda={a.lmbda}",
               [f"algo.gamma={a.gamma}", f"algo.lmbda={a.lmbda}"]),
        Mapped("actor gradient", f"algo.actor_grad={a.actor_grad}", [],
               "dreamer_v3_5 learns every action with REINFORCE"),
        Mapped("replay value loss", f"algo.replay_value_scale={a.replay_value_scale} (features detached)",
               [f"algo.loss_scales.replay_value={a.replay_value_scale}", f"algo.critic.replay_loss={replay_value}",
                "algo.critic.replay_grad=False"]),
        Mapped("slow critic", f"algo.slow_critic_tau={a.slow_critic_tau} algo.slow_critic_reg={a.slow_critic_reg}"
               " (every update)",
               [f"algo.critic.tau={a.slow_critic_tau}", f"algo.critic.slow_regularizer={a.slow_critic_reg}",
                "algo.critic.per_rank_target_network_update_freq=1"]),
        Mapped("reward head trains the world model", "yes (TorchRL's DreamerV3ModelLoss)",
               [f"{wm}.reward_grad=True"]),
        Mapped("optimiser", f"3 LaProp+AGC (world model, actor, value), 2 backward passes (the world model's, "
               f"then one for actor and value); lr "
               f"{a.world_model_lr}/{a.actor_lr}/{a.value_lr}, agc {a.agc}, eps {a.adam_eps}",
               [f"algo.optimizer.lr={a.world_model_lr}", f"algo.optimizer.agc={a.agc}",
                f"algo.optimizer.eps={a.adam_eps}", f"algo.optimizer.warmup={a.lr_warmup_steps}"],
               "not a setting: sheeprl takes one LaProp+AGC step over all weights after one backward"),
        precision_row(cfg),
        Mapped("compile", "per side: ours_eager off, ours_compiled the compiled-losses path (actor/value losses "
               "and, with "
               f"compile.rssm_step={cfg.compile.rssm_step}, the RSSM step; the world model's loop eager), "
               "ours_whole the whole update as one compiled function",
               ["algo.compile.enabled=False"],
               "sheeprl eager"),
        Mapped("threads", f"torch.set_num_threads({threads})", [f"num_threads={threads}"],
               "both sides also get OMP_NUM_THREADS"),
        Mapped("metrics", "every update's metrics kept as device tensors", ["metric.log_level=1"],
               "sheeprl's default: its aggregator is updated every update"),
        Mapped("host memory", f"retain_host_memory={cfg.retain_host_memory} (as the app's learner sets at start)",
               [], "sheeprl: glibc's malloc defaults"),
        Mapped("batches", "a replay filled by a rollout of our acting policy; replay.sample() untimed", [],
               "sheeprl: windows of a random-action rollout, time first; untimed"),
        Mapped("seed", f"seed={cfg.seed}", [f"seed={cfg.seed}"]),
    ]


def precision_row(cfg) -> Mapped:
    if not cfg.device.startswith("cuda"):
        return Mapped("precision", "fp32 (no autocast on CPU)", ["fabric.precision=32-true",
                      "float32_matmul_precision=highest"], "fp32 as asked; its default 'high' timed the same on a CPU")
    bf16 = cfg.autocast != "off"
    return Mapped("precision", f"{'bf16 autocast' if bf16 else 'fp32'} on CUDA, TF32 matmuls (cuda_fast_math)",
                  ["fabric.accelerator=cuda", f"fabric.precision={'bf16-mixed' if bf16 else '32-true'}",
                   "float32_matmul_precision=high"])


def sheeprl_overrides(rows: list[Mapped]) -> list[str]:
    return [override for row in rows for override in row.sheeprl]


def print_mapping(name: str, overrides: list[str], rows: list[Mapped]) -> None:
    print(f"\n== {name}: ours {' '.join(overrides)}  vs  sheeprl {SHEEPRL_VERSION} dreamer_v3_5")
    width = max(len(r.setting) for r in rows)
    for r in rows:
        print(f"  {r.setting:<{width}}  ours: {r.ours}")
        print(f"  {'':<{width}}  sheeprl: {' '.join(r.sheeprl) or '-'}" + (f"  ({r.note})" if r.note else ""))


# -- the sheeprl side, inside its own process ---------------------------------------------------------
def random_play(env_id: str, steps: int, seed: int) -> dict:
    """A random-action rollout in sheeprl's step layout: obs, is_first, the action taken there (in [-1, 1]),
    and the reward/terminated/truncated that led to that obs."""
    import gymnasium as gym
    import numpy as np

    env = gym.make(env_id)
    env.action_space.seed(seed)
    low, high = env.action_space.low, env.action_space.high
    cols = {k: [] for k in ("state", "actions", "rewards", "terminated", "truncated", "is_first")}
    obs, _ = env.reset(seed=seed)
    reward, terminated, truncated, first = 0.0, False, False, True
    for _ in range(steps):
        action = env.action_space.sample()
        for key, value in (("state", obs), ("actions", (action - low) / (high - low) * 2 - 1),
                           ("rewards", [reward]), ("terminated", [terminated]), ("truncated", [truncated]),
                           ("is_first", [first])):
            cols[key].append(np.asarray(value, dtype=np.float32))
        obs, reward, terminated, truncated, _ = env.step(action)
        first = False
        if terminated or truncated:
            obs, _ = env.reset()
            first = True
    env.close()
    return {k: np.stack(v) for k, v in cols.items()}


def sequence_sampler(rollout: dict, batch_size: int, length: int, seed: int, device="cpu"):
    """() -> a batch of ``batch_size`` random windows of ``length`` steps, time first ([T, B, ...]), on
    ``device`` (as sheeprl's replay samples onto the fabric's device)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    steps = len(rollout["state"])

    def sample() -> dict:
        starts = rng.integers(0, steps - length + 1, size=batch_size)
        index = starts[None, :] + np.arange(length)[:, None]
        return {k: torch.from_numpy(v[index]).to(device) for k, v in rollout.items()}

    return sample


def build_sheeprl(spec: dict) -> Built:
    """sheeprl's dreamer_v3_5 agent, optimiser, return moments and metrics aggregator, built as its
    `main` builds them, from its own config composed with the mapped overrides."""
    import gymnasium as gym
    import hydra
    import torch
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from sheeprl.algos.dreamer_v3_5 import dreamer_v3_5 as dv3_5
    from sheeprl.algos.dreamer_v3_5.agent import build_agent
    from sheeprl.algos.dreamer_v3_5.utils import AGGREGATOR_KEYS, Moments
    from sheeprl.utils.metric import MetricAggregator
    from sheeprl.utils.utils import dotdict
    from torch.distributions import Distribution

    with initialize_config_module(config_module="sheeprl.configs", version_base="1.3"):
        cfg = compose("config", overrides=spec["sheeprl_overrides"])
    cfg = dotdict(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
    # What sheeprl's CLI (run_algorithm) sets before its main runs.
    torch.set_float32_matmul_precision(cfg.float32_matmul_precision)
    Distribution.set_default_validate_args(cfg.distribution.validate_args)
    for key in set(cfg.metric.aggregator.metrics) - AGGREGATOR_KEYS:
        cfg.metric.aggregator.metrics.pop(key)
    MetricAggregator.disabled = cfg.metric.log_level == 0 or not cfg.metric.aggregator.metrics
    fabric = hydra.utils.instantiate(cfg.fabric, strategy="auto", _convert_="all")
    fabric.seed_everything(cfg.seed)

    env = gym.make(cfg.env.id)
    if not isinstance(env.action_space, gym.spaces.Box):
        raise SystemExit("error: the sheeprl side maps continuous-action envs only")
    obs_space = gym.spaces.Dict({"state": env.observation_space})
    actions_dim = tuple(env.action_space.shape)
    env.close()
    world_model, actor, critic, target_critic, _ = build_agent(fabric, actions_dim, True, cfg, obs_space)
    optimizer = hydra.utils.instantiate(
        cfg.algo.optimizer, params=[*world_model.parameters(), *actor.parameters(), *critic.parameters()],
        _convert_="all",
    )
    optimizer = fabric.setup_optimizers(optimizer)
    m = cfg.algo.actor.moments
    moments = Moments(m.decay, m.max, m.percentile.low, m.percentile.high)
    aggregator = None
    if not MetricAggregator.disabled:
        aggregator = hydra.utils.instantiate(cfg.metric.aggregator, _convert_="all").to(fabric.device)

    def update(batch: dict) -> None:
        dv3_5.train(fabric, cfg, world_model, actor, critic, target_critic, optimizer, moments, batch,
                    aggregator, actions_dim)
        dv3_5.update_target_critic(critic, target_critic, cfg.algo.critic.tau)

    a, rssm = cfg.algo, world_model.rssm
    batch, length = a.per_rank_batch_size, a.per_rank_sequence_length
    rollout = random_play(cfg.env.id, max(4 * batch * length, 1000), cfg.seed)
    params = {
        "encoder": count_params(world_model.encoder), "decoder": count_params(world_model.observation_model),
        "rssm prior (GRU + prior head)": count_params(rssm.recurrent_model, rssm.transition_model),
        "rssm posterior": count_params(rssm.representation_model), "reward": count_params(world_model.reward_model),
        "continue": count_params(world_model.continue_model), "actor": count_params(actor),
        "critic": count_params(critic),
    }
    sync = torch.cuda.synchronize if fabric.device.type == "cuda" else (lambda: None)
    return Built(update, sequence_sampler(rollout, batch, length, cfg.seed, fabric.device), params, sync=sync)


# -- the parent: one process per side, asked in turn -----------------------------------------------------
def print_params(params: dict[str, dict[str, int]]) -> None:
    sides = list(params)
    print(f"  {'parameters':<30}" + "".join(f"{s:>18}" for s in sides))
    for row in PARAM_ROWS:
        counts = [params[s][row] for s in sides]
        flag = "" if len(set(counts)) == 1 else "   differ"
        print(f"  {row:<30}" + "".join(f"{c:>18,}" for c in counts) + flag)
    print(f"  {'total':<30}" + "".join(f"{sum(params[s].values()):>18,}" for s in sides))


def side_specs(overrides: list[str], cfg, rows: list[Mapped], args, cache_dir: str) -> tuple[dict, dict]:
    """({side: its process's spec}, {side: why it cannot run here}) for every side."""
    losses, _ = update_path_overrides("losses")
    whole, whole_skip = update_path_overrides("whole")
    ours = {"kind": "ours", "fill_steps": args.fill_steps}
    compiled = ["compile.enabled=true", *args.compiled_overrides]
    specs = {
        "sheeprl": {"kind": "sheeprl", "sheeprl_overrides": sheeprl_overrides(rows)},
        "torchrl_eager": {"kind": "torchrl", "device": "cpu", "fill_steps": args.fill_steps,
                          "recipe": torchrl_v3.recipe_config(cfg, compiled=False, cuda=False)},
        "torchrl_compiled": {"kind": "torchrl", "device": "cpu", "fill_steps": args.fill_steps,
                             "recipe": torchrl_v3.recipe_config(cfg, compiled=True, cuda=False)},
        "ours_eager": {**ours, "overrides": [*overrides, "compile.enabled=false"]},
        "ours_compiled": {**ours,
                          "overrides": [*overrides, *compiled, *losses, f"compile.cache_dir={cache_dir}/losses"]},
        "ours_whole": {**ours, "overrides": [*overrides, *compiled, *whole, f"compile.cache_dir={cache_dir}/whole"]},
    }
    return specs, ({"ours_whole": whole_skip} if whole_skip else {})


def run_config(name: str, args: argparse.Namespace, sides: list[str]) -> dict:
    """Map, build every side, time them in alternating rounds; the config's figures."""
    overrides = PRESETS[name] + args.overrides
    cfg = compose(overrides)
    rows = mapping(cfg, args.threads)
    print_mapping(name, overrides, rows)
    with tempfile.TemporaryDirectory(prefix="benchmark_peers_inductor_") as cold_dir:
        cache_dir = args.compile_cache_dir or cold_dir
        specs, skipped = side_specs(overrides, cfg, rows, args, cache_dir)
        recipes = {side: specs[side]["recipe"] for side in sides if side.startswith("torchrl")}
        for side, recipe in recipes.items():
            for line in torchrl_v3.describe(recipe):
                print(f"  {side} recipe {line}")
        skipped = {side: why for side, why in skipped.items() if side in sides}
        for side, why in skipped.items():
            print(f"  SKIP {side}: {why}")
        sides = [side for side in sides if side not in skipped]
        procs: dict[str, SideProcess] = {}
        try:
            for side in sides:
                python = args.sheeprl_python if side == "sheeprl" else sys.executable
                # Each side's inductor cache apart: no side's warm-up reads another's kernels.
                env = {"TORCHINDUCTOR_CACHE_DIR": f"{cache_dir}/{side}"} if side.startswith("torchrl") else {}
                procs[side] = SideProcess(side, python, SCRIPT, {**specs[side], "threads": args.threads},
                                          threads=args.threads, env=env, timeout_s=SIDE_TIMEOUT_S)
                info = procs[side].built()
                warm = info["compile_warmup_s"]
                print(f"  built {side} in {info['build_s']:.1f} s"
                      + (f" (compile warm-up {warm:.1f} s)" if warm is not None else ""), flush=True)
            print_params({side: p.info["params"] for side, p in procs.items()})
            rounds = {side: [] for side in sides}
            print(f"  {'round':>5}" + "".join(f"{s + ' s':>18}" for s in sides))
            for r in range(args.rounds):
                for side in (sides if r % 2 == 0 else sides[::-1]):
                    rounds[side].append(procs[side].time(args.warmup, args.reps))
                print(f"  {r:>5}" + "".join(f"{rounds[s][-1]['wall_s']:>18.3f}" for s in sides), flush=True)
        except SideFailed as err:
            raise SystemExit(f"{err}\nerror: {name}: a side failed (its log above)") from None
        finally:
            for proc in procs.values():
                proc.stop()
    result = summarize(rounds, PATH_SIDES.get(shipped_update_path(cfg)))
    result.update(ours_overrides=overrides, skipped=skipped,
                  params={side: p.info["params"] for side, p in procs.items()},
                  mapping=[{"setting": r.setting, "ours": r.ours, "sheeprl": r.sheeprl, "note": r.note} for r in rows],
                  torchrl_recipe=recipes,
                  compile_warmup_s={side: p.info["compile_warmup_s"] for side, p in procs.items()
                                    if p.info["compile_warmup_s"] is not None})
    return result


# Speedup variants: (ours side, the peer side it is measured against); "shipped" is filled in per config.
VERSUS = {
    "sheeprl": {"eager": ("ours_eager", "sheeprl"), "compiled": ("ours_compiled", "sheeprl")},
    "torchrl": {"eager": ("ours_eager", "torchrl_eager"), "compiled": ("ours_compiled", "torchrl_compiled"),
                "whole": ("ours_whole", "torchrl_compiled")},
}
SHIPPED_AGAINST = {"sheeprl": "sheeprl", "torchrl": "torchrl_compiled"}


def summarize(rounds: dict[str, list[dict]], shipped: str | None) -> dict:
    """Medians per side and speedups (medians of per-round ratios peer_s / ours_s) per variant."""
    def median_of(side: str, key: str):
        return statistics.median(r[key] for r in rounds[side]) if side in rounds else None

    def ratios(ours: str | None, peer: str) -> list[float]:
        if ours not in rounds or peer not in rounds:
            return []
        return [p["wall_s"] / o["wall_s"] for p, o in zip(rounds[peer], rounds[ours])]

    result = {"shipped": shipped.removeprefix("ours_") if shipped else None}
    for side in SIDES:
        result[f"{side}_s"] = median_of(side, "wall_s")
        result[f"{side}_cpu_s"] = median_of(side, "cpu_s")
    result["ours_shipped_s"] = result.get(f"{shipped}_s")
    for peer, variants in VERSUS.items():
        for variant, (ours, against) in {"shipped": (shipped, SHIPPED_AGAINST[peer]), **variants}.items():
            per_round = ratios(ours, against)
            result[f"speedup_vs_{peer}_{variant}"] = statistics.median(per_round) if per_round else None
            result[f"speedup_vs_{peer}_{variant}_per_round"] = per_round
    result["rounds"] = rounds
    return result


def print_summary(name: str, r: dict) -> None:
    def fmt(value, spec=".3f", unit=" s"):
        return "-" if value is None else f"{value:{spec}}{unit}"

    print(f"  {name}: s per update (process CPU s): "
          + ", ".join(f"{side} {fmt(r[f'{side}_s'])} ({fmt(r[f'{side}_cpu_s'])})" for side in SIDES)
          + f"; as shipped = {r['shipped']}")
    if r["compile_warmup_s"]:
        print(f"  {name}: compile warm-up " + ", ".join(f"{s} {v:.1f} s" for s, v in r["compile_warmup_s"].items()))
    for peer, variants in VERSUS.items():
        print(f"  {name}: speedup vs {peer}: " + ", ".join(
            f"{variant} {fmt(r[f'speedup_vs_{peer}_{variant}'], '.2f', 'x')}" for variant in ("shipped", *variants))
            + " (medians of per-round ratios)")


def sheeprl_problem(python: str, alternative: str = " (or --sides ours torchrl to time the others)") -> str | None:
    """None when ``python`` imports sheeprl's dreamer_v3_5; else the one line saying how to install it."""
    probe = ("import importlib.metadata as m, sheeprl.algos.dreamer_v3_5.dreamer_v3_5; "
             "print(m.version('sheeprl'))")
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300,
                               stdin=subprocess.DEVNULL)
    except OSError as err:
        return "error: " + INSTALL_HINT.format(where=f" ({python}: {err.strerror})", alternative=alternative)
    if found.returncode != 0:
        where = "" if python == sys.executable else f" in {python}"
        return "error: " + INSTALL_HINT.format(where=where, alternative=alternative)
    version = found.stdout.strip().splitlines()[-1] if found.stdout.strip() else "?"
    if version != SHEEPRL_VERSION:
        print(f"warning: sheeprl {version} found, the mapping is written for {SHEEPRL_VERSION}", file=sys.stderr)
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", choices=list(PRESETS), default=list(PRESETS))
    parser.add_argument("--sides", nargs="+", choices=[*SIDES, *GROUPS], default=["ours", "sheeprl", "torchrl"],
                        help="which to run (default all; ours = every ours_*, torchrl = both torchrl_*)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--reps", type=int, default=10, help="timed updates per side and round (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed updates per side and round (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on every side (default 2)")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="extra Hydra overrides for ours, mapped onto the peers too")
    parser.add_argument("--compiled-overrides", nargs="*", default=[],
                        help="extra Hydra overrides for ours_compiled and ours_whole only (their best settings)")
    parser.add_argument("--compile-cache-dir", help="a kept inductor cache dir for the compiled sides "
                                                    "(default: a fresh one, so the warm-ups are cold)")
    parser.add_argument("--fill-steps", type=int, help="steps of our acting policy (TorchRL's: random) that fill "
                                                        "the replays (default: harness.build's, 4 batches, >= 1000)")
    parser.add_argument("--sheeprl-python", default=sys.executable,
                        help="the Python that has sheeprl (default: this one)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # internal: run one side
    args = parser.parse_args(argv)
    if min(args.rounds, args.reps, args.threads, args.fill_steps or 1) < 1 or args.warmup < 0:
        parser.error("--rounds, --reps, --threads and --fill-steps must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve({"ours": build_ours, "sheeprl": build_sheeprl, "torchrl": torchrl_v3.build_torchrl},
                     json.loads(args.serve))
    sides = [s for s in SIDES if s in args.sides or any(s in GROUPS[g] for g in args.sides if g in GROUPS)]
    if "sheeprl" in sides and (problem := sheeprl_problem(args.sheeprl_python)):
        print(problem, file=sys.stderr)
        return 2
    # Every config's keys, null where it (or a peer) did not run.
    results: dict = {f"speedup_vs_{peer}_{name}{variant}": None for name in PRESETS
                     for peer, variants in VERSUS.items() for variant in ("", *(f"_{v}" for v in variants))}
    results.update(threads=args.threads, rounds=args.rounds, reps=args.reps, warmup=args.warmup, sides=sides,
                   configs={})
    for name in args.configs:
        results["configs"][name] = run_config(name, args, sides)
    print()
    for name, r in results["configs"].items():
        print_summary(name, r)
        for peer, variants in VERSUS.items():
            for variant in ("shipped", *variants):
                suffix = "" if variant == "shipped" else f"_{variant}"
                results[f"speedup_vs_{peer}_{name}{suffix}"] = r[f"speedup_vs_{peer}_{variant}"]
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
