"""What a weight push to collector workers costs the learner, against an update.

    python scripts/benchmark_weight_push.py experiment=pendulum collector.num_workers=2
    python scripts/benchmark_weight_push.py experiment=smoke --pushes 30 --json out.json
    python scripts/benchmark_weight_push.py experiment=smoke --workers-hold-a-copy

Runs the train loop's shape on the CPU: spawned collector workers step their
envs, each collector batch goes into the replay buffer, the learner updates
(eager), and every ``collector.weight_sync_every`` updates the learner's
weights are pushed to the workers, alternating two ways of pushing:

- ``blocking``: torchrl's synchronous ``SharedMemWeightSyncScheme.send``
  (copy into the shared buffers, instruct every worker, wait for every
  acknowledgement), what the run did before;
- ``staged``: ``NonBlockingSharedMemWeightSyncScheme.send`` (what the run
  does). With the weights on the host it publishes at once when the
  workers acknowledged the previous push (the untimed wait before each push
  makes sure of that; in a run a push still unacknowledged is simply
  published by a later poll), so the call is the learner's whole cost; the
  ``publish_ready`` poll the loop makes after every other update is timed
  apart.

Prints the median seconds per update and per push of each kind, and each
push's share of the update time between two pushes (push / (K x update)).
``--workers-hold-a-copy`` gives the workers their own copy of the policy, as
for a GPU learner (each push then copies the weights; on the CPU there is no
device-to-host copy to overlap). Keys in --json: ``update_s``, ``poll_s``,
``push_s`` {blocking, staged}, ``share`` {blocking, staged}, ``pushes``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from dreamer.config import load_config, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return load_config(hydra_compose("config", overrides=overrides))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=pendulum")
    parser.add_argument("--pushes", type=int, default=20, help="timed pushes of each kind (default 20)")
    parser.add_argument("--workers-hold-a-copy", action="store_true",
                        help="workers act with their own copy of the policy (as for a GPU learner)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    from torchrl.weight_update import SharedMemWeightSyncScheme

    from dreamer.algos.registry import algorithm
    from dreamer.data.collectors import make_collector
    from dreamer.data.replay import make_replay_buffer, write
    from dreamer.envs.factory import close_env, make_env
    from torchrl_ext import module_to

    cfg = compose([*args.overrides, "compile.enabled=false"])
    cfg.buffer.prefetch = 0
    cpu = torch.device("cpu")
    torch.manual_seed(cfg.seed)
    workers = max(1, cfg.collector.num_workers or 1)
    env = make_env(cfg.env, cfg.algo, seed=cfg.seed)
    build_models, learner_cls = algorithm(cfg.algo.name)
    models = build_models(cfg.algo, cfg.env, env, cpu)
    close_env(env)
    learner = learner_cls(cfg.algo, cfg.compile, models, cpu, batch_size=cfg.buffer.batch_size,
                          batch_length=cfg.buffer.batch_length)
    replay = make_replay_buffer(cfg.buffer, cpu)
    acting = models.policy(explore=True)
    sent = module_to(copy.deepcopy(acting), cpu) if args.workers_hold_a_copy else acting
    collector = make_collector(cfg.collector, cfg.env, cfg.algo, cfg.compile, sent, seed=cfg.seed,
                               workers=workers, random_frames=0, learner_threads=torch.get_num_threads())
    scheme = collector.weight_push
    every = cfg.collector.weight_sync_every
    update_s, poll_s, push_s = [], [], {"blocking": [], "staged": []}
    kinds = ["staged", "blocking"]
    updates = 0
    try:
        for batch in collector:
            write(replay, batch, models.obs_key)
            if len(replay) < cfg.buffer.batch_size * cfg.buffer.batch_length:
                continue
            for _ in range(2):  # updates per collector batch
                sample = replay.sample()
                start = time.perf_counter()
                learner.update(sample)
                update_s.append(time.perf_counter() - start)
                updates += 1
                if updates % every:
                    start = time.perf_counter()
                    scheme.publish_ready()  # what the train loop polls after every other update
                    poll_s.append(time.perf_counter() - start)
                    continue
                scheme.wait_until_published()  # untimed: both kinds start with no push in flight
                kind = kinds[(updates // every) % 2]
                start = time.perf_counter()
                if kind == "blocking":
                    SharedMemWeightSyncScheme.send(scheme, weights=acting)
                else:
                    scheme.send(weights=acting)
                push_s[kind].append(time.perf_counter() - start)
                if kind == "staged" and scheme._staged is not None:
                    raise RuntimeError("a host-side push was not published at once")
            if min(len(v) for v in push_s.values()) >= args.pushes:
                break
    finally:
        collector.shutdown()
    update = statistics.median(update_s[3:])  # the first updates warm up allocations
    results = {"overrides": args.overrides, "workers": workers, "weight_sync_every": every,
               "workers_hold_a_copy": args.workers_hold_a_copy, "update_s": update,
               "poll_s": statistics.median(poll_s), "push_s": {}, "share": {},
               "pushes": {k: len(v) for k, v in push_s.items()}}
    print(f"{workers} worker(s), a push every {every} updates; median update {update * 1e3:.1f} ms, "
          f"median poll between pushes {results['poll_s'] * 1e6:.1f} us")
    for kind, times in push_s.items():
        median = statistics.median(times)
        results["push_s"][kind] = median
        results["share"][kind] = median / (every * update)
        print(f"{kind:>9} push: median {median * 1e3:8.3f} ms over {len(times)} pushes = "
              f"{100 * results['share'][kind]:.3f}% of the update time between two pushes")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
