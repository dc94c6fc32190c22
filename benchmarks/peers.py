"""Seconds per DreamerV3 update: ours against sheeprl 0.8.4's DreamerV3 (`dreamer_v3_5`), side by side.

    python benchmarks/peers.py --rounds 3 --reps 5 --json out.json     # both configs, every side
    python benchmarks/peers.py --configs pendulum --sides ours sheeprl
    python benchmarks/peers.py --sides ours                            # without sheeprl installed
    python benchmarks/peers.py --sheeprl-python ~/venv-peers/bin/python  # sheeprl in its own venv

sheeprl comes from the `peers` extra, installed with torch held at ours:
`echo torch==2.13.0 > FILE && pip install -c FILE '.[peers]'` (README, "Against peers").

Configs (ours, then sheeprl mapped onto the same compute; the table printed at start lists every
setting that changes compute, and the parameter counts of both sides module by module):
  pendulum  experiment=small algo.actor_grad=reinforce (V3, 64 units, GRU 64 in 8 blocks, 16x16 latents,
            batch 16x16)
  size1m    experiment=gym_state algo.actor_grad=reinforce (size1m, batch 16x64)
Both on Pendulum-v1's 3-d state, fp32, --threads threads. Extra Hydra overrides for ours (--overrides) are
mapped onto sheeprl too, since the mapping is read from our composed config.

Sides, each in its own process (built one after another, so no compile warm-up overlaps a timing):
  sheeprl        its `train(...)` (world model, imagination, actor and critic losses, one backward, LaProp
                 step, metrics aggregator) and `update_target_critic(...)`, the calls its main loop makes
                 per update, on [T, B] windows of a random-action Pendulum-v1 rollout; eager.
  ours_eager     `learner.update(replay.sample())` (benchmarks/harness.py's `compose`/`build`),
                 compile.enabled=false.
  ours_compiled  the same with compile.enabled=true (+ --compiled-overrides: the best settings); its compile
                 warm-up (cold: a fresh inductor cache dir unless --compile-cache-dir) is reported apart.
"Ours as shipped" is whichever of the two the preset's own compile setting picks. --sides ours means both of ours.

Each round asks every side in turn (the order reversed every other round) for --warmup untimed updates
then --reps timed ones, and keeps their median; a side's figure is the median over rounds, and a
speedup is the median over rounds of the per-round ratio sheeprl_s / ours_s (measured side by side).
Keys in --json: speedup_vs_sheeprl_pendulum and speedup_vs_sheeprl_size1m (ours as shipped), the same
with _eager and _compiled, and under "configs" each config's mapping, parameter counts, medians
(sheeprl_s, ours_eager_s, ours_compiled_s, ours_shipped_s, cpu seconds), compile_warmup_s and the
per-round figures. A speedup whose sides did not run is null.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import build, compose, time_calls, write_report

SCRIPT = Path(__file__).resolve()
SHEEPRL_VERSION = "0.8.4"
INSTALL_HINT = (
    f"sheeprl=={SHEEPRL_VERSION} is not importable{{where}}: install it with torch held, "
    "`echo torch==2.13.0 > FILE && pip install -c FILE '.[peers]'`, or pass --sheeprl-python "
    "a Python that has it (or --sides ours to time ours alone)"
)
PRESETS = {
    "pendulum": ["experiment=small", "algo.actor_grad=reinforce"],
    "size1m": ["experiment=gym_state", "algo.actor_grad=reinforce"],
}
SIDES = ("sheeprl", "ours_eager", "ours_compiled")
OURS = ("ours_eager", "ours_compiled")
# Module rows of the parameter table: ours (learner.models.modules keys) and sheeprl's (see sheeprl_modules).
MODULES = {
    "encoder": ["encoder"], "decoder": ["decoder"], "rssm prior (GRU + prior head)": ["prior"],
    "rssm posterior": ["posterior"], "reward": ["reward"], "continue": ["continuation"],
    "actor": ["actor"], "critic": ["value"],
}
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
        Mapped("precision", "fp32 (no autocast on CPU)", ["fabric.precision=32-true",
               "float32_matmul_precision=highest"], "fp32 as asked; its default 'high' timed the same on this CPU"),
        Mapped("compile", "per side: ours_eager off, ours_compiled on (actor/value losses and, with "
               f"compile.rssm_step={cfg.compile.rssm_step}, the RSSM step; the world model's loop eager)",
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


def sheeprl_overrides(rows: list[Mapped]) -> list[str]:
    return [override for row in rows for override in row.sheeprl]


def print_mapping(name: str, overrides: list[str], rows: list[Mapped]) -> None:
    print(f"\n== {name}: ours {' '.join(overrides)}  vs  sheeprl {SHEEPRL_VERSION} dreamer_v3_5")
    width = max(len(r.setting) for r in rows)
    for r in rows:
        print(f"  {r.setting:<{width}}  ours: {r.ours}")
        print(f"  {'':<{width}}  sheeprl: {' '.join(r.sheeprl) or '-'}" + (f"  ({r.note})" if r.note else ""))


# -- a side, inside its own process -------------------------------------------------------------------
@dataclass
class Built:
    update: object  # batch -> None: one training update
    next_batch: object  # () -> batch, outside the timing
    params: dict[str, int]  # module row -> parameters
    compile_warmup_s: float | None = None


def _count(*modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def build_ours(spec: dict) -> Built:
    """Our learner and a replay buffer filled by a rollout of the acting policy, as the app's learner runs."""
    import torch

    from dreamer.system import compile_cache

    cfg = compose(spec["overrides"])
    torch.manual_seed(cfg.seed)
    learner, replay = build(cfg, spec.get("fill_steps"))
    modules = learner.models.modules
    params = {row: _count(*(modules[k] for k in keys)) for row, keys in MODULES.items()}
    warmup_s = None
    if cfg.compile.enabled:
        compile_cache.use_cache_dir(cfg.compile)
        learner.compile()
        warmup_s = learner.warmup(replay.sample())
    return Built(learner.update, replay.sample, params, warmup_s)


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


def sequence_sampler(rollout: dict, batch_size: int, length: int, seed: int):
    """() -> a batch of ``batch_size`` random windows of ``length`` steps, time first ([T, B, ...])."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    steps = len(rollout["state"])

    def sample() -> dict:
        starts = rng.integers(0, steps - length + 1, size=batch_size)
        index = starts[None, :] + np.arange(length)[:, None]
        return {k: torch.from_numpy(v[index]) for k, v in rollout.items()}

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
        "encoder": _count(world_model.encoder), "decoder": _count(world_model.observation_model),
        "rssm prior (GRU + prior head)": _count(rssm.recurrent_model, rssm.transition_model),
        "rssm posterior": _count(rssm.representation_model), "reward": _count(world_model.reward_model),
        "continue": _count(world_model.continue_model), "actor": _count(actor), "critic": _count(critic),
    }
    return Built(update, sequence_sampler(rollout, batch, length, cfg.seed), params)


def serve(spec: dict) -> int:
    """A side's process: build, say so (parameters, compile warm-up), then time rounds on request.
    Replies are JSON lines on the real stdout; anything the libraries print goes to stderr."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch

    torch.set_num_threads(spec["threads"])
    start = time.perf_counter()
    side = build_sheeprl(spec) if spec["side"] == "sheeprl" else build_ours(spec)
    replies.write(json.dumps({"params": side.params, "compile_warmup_s": side.compile_warmup_s,
                              "build_s": time.perf_counter() - start}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "stop":
            break
        timed = time_calls(side.update, side.next_batch, request["warmup"], request["reps"])
        replies.write(json.dumps(timed) + "\n")
    return 0


# -- the parent: one process per side, asked in turn -----------------------------------------------------
class SideProcess:
    """One side in its own process, spoken to in JSON lines; its output goes to a log file shown on failure."""

    def __init__(self, name: str, python: str, spec: dict, threads: int):
        self.name = name
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"benchmark_peers_{name}_", suffix=".log")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([python, str(SCRIPT), "--serve", json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.info = self._reply("build")

    def ask(self, request: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # _reply reports the dead process
        return self._reply(request["op"])

    def _reply(self, what: str) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], SIDE_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        state = "hung" if self.proc.poll() is None else f"died (exit code {self.proc.returncode})"
        self.log.seek(0)
        tail = "".join(self.log.readlines()[-25:])
        self.stop()
        raise SystemExit(f"{tail}\nerror: the {self.name} side's process {state} on {what!r} (its log above)")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
                self.proc.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def print_params(params: dict[str, dict[str, int]]) -> None:
    sides = list(params)
    print(f"  {'parameters':<30}" + "".join(f"{s:>14}" for s in sides))
    for row in MODULES:
        counts = [params[s][row] for s in sides]
        flag = "" if len(set(counts)) == 1 else "   differ"
        print(f"  {row:<30}" + "".join(f"{c:>14,}" for c in counts) + flag)
    print(f"  {'total':<30}" + "".join(f"{sum(params[s].values()):>14,}" for s in sides))


def run_config(name: str, args: argparse.Namespace, sides: list[str]) -> dict:
    """Map, build every side, time them in alternating rounds; the config's figures."""
    overrides = PRESETS[name] + args.overrides
    cfg = compose(overrides)
    rows = mapping(cfg, args.threads)
    print_mapping(name, overrides, rows)
    shipped = "ours_compiled" if cfg.compile.enabled else "ours_eager"
    with tempfile.TemporaryDirectory(prefix="benchmark_peers_inductor_") as cold_dir:
        cache_dir = args.compile_cache_dir or cold_dir
        specs = {
            "sheeprl": {"sheeprl_overrides": sheeprl_overrides(rows)},
            "ours_eager": {"overrides": [*overrides, "compile.enabled=false"], "fill_steps": args.fill_steps},
            "ours_compiled": {"overrides": [*overrides, "compile.enabled=true", f"compile.cache_dir={cache_dir}",
                                            *args.compiled_overrides], "fill_steps": args.fill_steps},
        }
        procs: dict[str, SideProcess] = {}
        try:
            for side in sides:
                python = args.sheeprl_python if side == "sheeprl" else sys.executable
                procs[side] = SideProcess(side, python, {"side": side, "threads": args.threads, **specs[side]},
                                          args.threads)
                warm = procs[side].info["compile_warmup_s"]
                print(f"  built {side} in {procs[side].info['build_s']:.1f} s"
                      + (f" (compile warm-up {warm:.1f} s)" if warm is not None else ""), flush=True)
            print_params({side: p.info["params"] for side, p in procs.items()})
            rounds = {side: [] for side in sides}
            print(f"  {'round':>5}" + "".join(f"{s + ' s':>16}" for s in sides))
            for r in range(args.rounds):
                for side in (sides if r % 2 == 0 else sides[::-1]):
                    rounds[side].append(procs[side].ask({"op": "time", "warmup": args.warmup, "reps": args.reps}))
                print(f"  {r:>5}" + "".join(f"{rounds[s][-1]['wall_s']:>16.3f}" for s in sides), flush=True)
        finally:
            for proc in procs.values():
                proc.stop()
    return summarize(name, overrides, rows, shipped, procs, rounds)


def summarize(name, overrides, rows, shipped, procs, rounds) -> dict:
    def median_of(side: str, key: str):
        return statistics.median(r[key] for r in rounds[side]) if side in rounds else None

    def ratios(side: str) -> list[float]:
        if "sheeprl" not in rounds or side not in rounds:
            return []
        return [s["wall_s"] / o["wall_s"] for s, o in zip(rounds["sheeprl"], rounds[side])]

    result = {
        "ours_overrides": overrides,
        "shipped": shipped.removeprefix("ours_"),
        "mapping": [{"setting": r.setting, "ours": r.ours, "sheeprl": r.sheeprl, "note": r.note} for r in rows],
        "params": {side: p.info["params"] for side, p in procs.items()},
        "compile_warmup_s": procs["ours_compiled"].info["compile_warmup_s"] if "ours_compiled" in procs else None,
    }
    for side in SIDES:
        result[f"{side}_s"] = median_of(side, "wall_s")
        result[f"{side}_cpu_s"] = median_of(side, "cpu_s")
    result["ours_shipped_s"] = result[f"{shipped}_s"]
    for variant, side in (("shipped", shipped), ("eager", "ours_eager"), ("compiled", "ours_compiled")):
        per_round = ratios(side)
        result[f"speedup_vs_sheeprl_{variant}"] = statistics.median(per_round) if per_round else None
        result[f"speedup_vs_sheeprl_{variant}_per_round"] = per_round
    result["rounds"] = rounds
    return result


def print_summary(name: str, r: dict) -> None:
    def fmt(value, spec=".3f", unit=" s"):
        return "-" if value is None else f"{value:{spec}}{unit}"

    print(f"  {name}: sheeprl {fmt(r['sheeprl_s'])}, ours eager {fmt(r['ours_eager_s'])}, "
          f"ours compiled {fmt(r['ours_compiled_s'])} (compile warm-up {fmt(r['compile_warmup_s'], '.1f')}); "
          f"as shipped = {r['shipped']}")
    print(f"  {name}: process CPU s per update: sheeprl {fmt(r['sheeprl_cpu_s'])}, ours eager "
          f"{fmt(r['ours_eager_cpu_s'])}, ours compiled {fmt(r['ours_compiled_cpu_s'])}")
    print(f"  {name}: speedup vs sheeprl as shipped {fmt(r['speedup_vs_sheeprl_shipped'], '.2f', 'x')}, "
          f"eager {fmt(r['speedup_vs_sheeprl_eager'], '.2f', 'x')}, "
          f"compiled {fmt(r['speedup_vs_sheeprl_compiled'], '.2f', 'x')} (medians of per-round ratios)")


def sheeprl_problem(python: str) -> str | None:
    """None when ``python`` imports sheeprl's dreamer_v3_5; else the one line saying how to install it."""
    probe = ("import importlib.metadata as m, sheeprl.algos.dreamer_v3_5.dreamer_v3_5; "
             "print(m.version('sheeprl'))")
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300,
                               stdin=subprocess.DEVNULL)
    except OSError as err:
        return "error: " + INSTALL_HINT.format(where=f" ({python}: {err.strerror})")
    if found.returncode != 0:
        where = "" if python == sys.executable else f" in {python}"
        return "error: " + INSTALL_HINT.format(where=where)
    version = found.stdout.strip().splitlines()[-1] if found.stdout.strip() else "?"
    if version != SHEEPRL_VERSION:
        print(f"warning: sheeprl {version} found, the mapping is written for {SHEEPRL_VERSION}", file=sys.stderr)
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", choices=list(PRESETS), default=list(PRESETS))
    parser.add_argument("--sides", nargs="+", choices=[*SIDES, "ours"], default=["ours", "sheeprl"],
                        help="which to run (default all; ours = ours_eager and ours_compiled)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--reps", type=int, default=10, help="timed updates per side and round (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed updates per side and round (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on every side (default 2)")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="extra Hydra overrides for ours, mapped onto sheeprl too")
    parser.add_argument("--compiled-overrides", nargs="*", default=[],
                        help="extra Hydra overrides for ours_compiled only (its best settings)")
    parser.add_argument("--compile-cache-dir", help="a kept inductor cache dir for ours_compiled "
                                                    "(default: a fresh one, so the warm-up is cold)")
    parser.add_argument("--fill-steps", type=int, help="steps of our acting policy that fill our replay "
                                                        "(default: harness.build's, 4 batches, at least 1000)")
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
        return serve(json.loads(args.serve))
    sides = [s for s in SIDES if s in args.sides or (s in OURS and "ours" in args.sides)]
    if "sheeprl" in sides and (problem := sheeprl_problem(args.sheeprl_python)):
        print(problem, file=sys.stderr)
        return 2
    # Every config's keys, null where it (or sheeprl) did not run.
    results: dict = {f"speedup_vs_sheeprl_{name}{variant}": None
                     for name in PRESETS for variant in ("", "_eager", "_compiled")}
    results.update(threads=args.threads, rounds=args.rounds, reps=args.reps, warmup=args.warmup, sides=sides,
                   configs={})
    for name in args.configs:
        results["configs"][name] = run_config(name, args, sides)
    print()
    for name, r in results["configs"].items():
        print_summary(name, r)
        for variant, key in (("", "shipped"), ("_eager", "eager"), ("_compiled", "compiled")):
            results[f"speedup_vs_sheeprl_{name}{variant}"] = r[f"speedup_vs_sheeprl_{key}"]
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
