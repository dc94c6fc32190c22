"""Seconds per update of the JAX DreamerV3 reference (danijar/dreamerv3 at e3f02248, the commit TorchRL's
recipe tracks), driven from Python: a side for benchmarks/gpu_bench.py, and runnable alone.

    python3 benchmarks/jax_v3.py --dreamerv3-src DIR experiment=gym_state_v3 algo.actor_grad=reinforce device=cuda

Its source is not ours to ship: DIR is a checkout of that commit (`git clone` danijar/dreamerv3, then
`git checkout e3f02248`) whose requirements (jax, elements, ninjax, portal, granular, ruamel.yaml, optax,
chex, einops, jaxtyping) the Python running it has; the side puts DIR on its PYTHONPATH.

Built as its main.py's ``make_agent`` builds the agent: configs.yaml's defaults, then what our composed
config sets (``jax_config``): RSSM deter / hidden / stoch / classes / blocks, MLP units and layers (its
reward and continue heads at algo.mlp_layers layers, as ours; its default is 1), CNN depth, two-hot bins,
imagination horizon, batch B x T, replay_context 0 (every sequence starts from zeros, as ours), loss
weights, optimiser, returns and slow critic; bfloat16 compute on CUDA (float32 on the CPU), its profiler
off, GPU memory allocated as needed (other sides share the GPU). Timed: ``agent.train(carry, batch)``
until its new parameters are ready, on batches of random Pendulum-v1 play (states) fed through
``agent.stream`` outside the timing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from harness import Built, compose, time_calls

COMMIT = "e3f02248"
# Our parameter-table rows (harness.PARAM_ROWS) -> the prefixes of its parameter names.
PARAM_PREFIXES = {
    "encoder": ("enc/",), "decoder": ("dec/",), "rssm posterior": ("dyn/obs",), "reward": ("rew/",),
    "continue": ("con/",), "actor": ("pol/",), "critic": ("val/",),
}
PRIOR_ROW = "rssm prior (GRU + prior head)"  # every other dyn/ weight: GRU inputs, blocks, prior head


def jax_config(cfg) -> dict:
    """configs.yaml updates (its dotted keys) that give our composed DreamerV3 ``cfg``'s sizes and batch."""
    a, b = cfg.algo, cfg.buffer
    if a.name != "dreamer_v3" or cfg.env.from_pixels:
        raise SystemExit("error: the JAX side maps DreamerV3 on a state vector only")
    cuda = cfg.device.startswith("cuda")
    rssm = "agent.dyn.rssm"
    return {
        "batch_size": b.batch_size, "batch_length": b.batch_length, "replay_context": 0, "seed": cfg.seed,
        f"{rssm}.deter": a.rssm_hidden_dim, f"{rssm}.hidden": a.hidden_dim, f"{rssm}.stoch": a.num_categoricals,
        f"{rssm}.classes": a.num_classes, f"{rssm}.blocks": a.gru_blocks, f"{rssm}.unimix": a.unimix,
        f"{rssm}.free_nats": a.free_bits,
        **{f"agent.{part}.units": a.hidden_dim for part in ("enc.simple", "dec.simple", "rewhead", "conhead",
                                                          "policy", "value")},
        **{f"agent.{part}.layers": a.mlp_layers for part in ("enc.simple", "dec.simple", "rewhead", "conhead",
                                                           "policy", "value")},
        "agent.enc.simple.depth": a.encoder_channels, "agent.dec.simple.depth": a.encoder_channels,
        "agent.rewhead.bins": a.num_bins, "agent.value.bins": a.num_bins,
        "agent.imag_length": a.imagination_horizon, "agent.horizon": round(1 / (1 - a.gamma)),
        # Not compute, but ours: loss weights, optimiser, returns, slow critic.
        "agent.loss_scales.dyn": a.dyn_loss_scale, "agent.loss_scales.rep": a.rep_loss_scale,
        "agent.loss_scales.repval": a.replay_value_scale, "agent.repval_loss": a.replay_value_scale > 0,
        "agent.opt.lr": a.world_model_lr, "agent.opt.agc": a.agc, "agent.opt.eps": a.adam_eps,
        "agent.opt.warmup": a.lr_warmup_steps, "agent.imag_loss.actent": a.entropy_scale,
        "agent.imag_loss.lam": a.lmbda, "agent.repl_loss.lam": a.lmbda, "agent.imag_loss.slowreg": a.slow_critic_reg,
        "agent.repl_loss.slowreg": a.slow_critic_reg, "agent.slowvalue.rate": a.slow_critic_tau,
        "agent.retnorm.rate": a.return_norm_rate, "agent.retnorm.limit": a.return_norm_min_scale,
        "jax.platform": "cuda" if cuda else "cpu",
        "jax.compute_dtype": "bfloat16" if cuda and cfg.autocast != "off" else "float32",
        "jax.prealloc": False,
    }


def random_batches(obs_dim: int, batch_size: int, length: int, seed: int):
    """() -> a batch-first dict in its layout ([B, T]) of windows of random Pendulum-v1 play."""
    import numpy as np
    from peers import random_play

    play = random_play("Pendulum-v1", max(4 * batch_size * length, 1000), seed)
    is_first = play["is_first"][:, 0] > 0
    columns = {  # Pendulum never terminates: its episodes end by time limit (the step before a reset)
        "vector": play["state"], "action": play["actions"], "reward": play["rewards"][:, 0], "is_first": is_first,
        "is_last": np.roll(is_first, -1), "is_terminal": np.zeros_like(is_first),
    }
    rng = np.random.default_rng(seed)
    steps = len(play["state"])

    def sample() -> dict:
        index = rng.integers(0, steps - length + 1, size=batch_size)[:, None] + np.arange(length)
        batch = {k: v[index] for k, v in columns.items()}
        batch["consec"] = np.zeros((batch_size, length), np.int32)
        batch["stepid"] = np.zeros((batch_size, length, 20), np.uint8)
        return batch

    return sample


def jax_params(agent) -> dict[str, int]:
    """Its parameters in harness.PARAM_ROWS' rows (optimizer and normalizer state left out)."""
    rows = {row: 0 for row in (*PARAM_PREFIXES, PRIOR_ROW)}
    for name, value in agent.params.items():
        row = next((r for r, prefixes in PARAM_PREFIXES.items() if name.startswith(prefixes)), None)
        if row is None and name.startswith("dyn/"):
            row = PRIOR_ROW
        if row is not None:
            rows[row] += int(value.size)
    return rows


def build_jax(spec: dict) -> Built:
    """Its agent (``spec["src"]`` on PYTHONPATH, ``spec["config"]`` from ``jax_config``), compiled at build."""
    import elements
    import embodied
    import jax
    import numpy as np
    import ruamel.yaml as yaml
    from dreamerv3.agent import Agent

    src = Path(spec["src"])
    configs = yaml.YAML(typ="safe").load((src / "dreamerv3" / "configs.yaml").read_text())
    config = elements.Config(configs["defaults"]).update(spec["config"])
    obs_dim = 3  # Pendulum-v1's state
    obs_space = {"vector": elements.Space(np.float32, (obs_dim,)), "reward": elements.Space(np.float32),
                 **{key: elements.Space(bool) for key in ("is_first", "is_last", "is_terminal")}}
    act_space = {"action": elements.Space(np.float32, (1,), -1, 1)}
    logdir = Path(spec.get("logdir") or f"/tmp/jax_v3_{os.getpid()}")
    start = time.perf_counter()
    jax_options = elements.Config({**config.jax, "profiler": False})  # it would trace updates 100-120
    agent = Agent(obs_space, act_space, elements.Config(
        **config.agent, logdir=str(logdir), seed=config.seed, jax=jax_options, batch_size=config.batch_size,
        batch_length=config.batch_length, replay_context=config.replay_context,
        report_length=config.report_length, replica=config.replica, replicas=config.replicas,
    ))
    build_s = time.perf_counter() - start  # its jit compile of train and report (jax.precompile) included
    sample = random_batches(obs_dim, config.batch_size, config.batch_length, config.seed)
    stream = iter(agent.stream(embodied.streams.Stateless(sample)))
    carry = [agent.init_train(config.batch_size)]

    def update(batch: dict) -> None:
        carry[0], _, _ = agent.train(carry[0], batch)
        jax.block_until_ready(agent.params)

    return Built(update, lambda: next(stream), jax_params(agent), build_s)


def side_spec(overrides: list[str], src: str) -> dict:
    """The spec of a JAX side (``kind`` jax) at our config ``overrides``."""
    return {"kind": "jax", "src": str(Path(src).resolve()), "config": jax_config(compose(overrides))}


def problem(python: str, src: str | None) -> str | None:
    """None when ``python`` imports its agent from ``src``; else the one line saying what is missing."""
    import subprocess

    if not src:
        return f"no --dreamerv3-src (a checkout of danijar/dreamerv3 at {COMMIT})"
    probe = "import jax, dreamerv3.agent; print(jax.__version__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300,
                               stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{python} could not run: {err}"
    if found.returncode != 0:
        last = [line for line in found.stderr.splitlines() if line.strip()][-1:] or ["no error output"]
        return f"its agent does not import from {src} with {python}: {last[0][:300]}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="our Hydra overrides, e.g. experiment=gym_state_v3")
    parser.add_argument("--dreamerv3-src", required=True, help=f"a checkout of danijar/dreamerv3 at {COMMIT}")
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates first (default 2)")
    parser.add_argument("--reps", type=int, default=5, help="timed updates (default 5)")
    args = parser.parse_args(argv)
    if why := problem(sys.executable, args.dreamerv3_src):
        print(f"error: {why}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(args.dreamerv3_src).resolve()))  # what the side's PYTHONPATH does
    side = build_jax(side_spec(args.overrides, args.dreamerv3_src))
    print(f"parameters: {sum(side.params.values()):,} {side.params}; "
          f"built and compiled in {side.compile_warmup_s:.1f} s")
    timed = time_calls(side.update, side.next_batch, args.warmup, args.reps)
    print(f"{timed['wall_s']:.4f} s per update (median of {args.reps}), {timed['cpu_s']:.4f} s process CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
