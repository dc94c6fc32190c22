"""What the learner's cores are worth to one update: seconds an update saves by
running on all of this rank's cores instead of one. Measured once at start,
before the workers spawn, beside what collecting one update's agent steps costs
(dreamer.system.cpus.collects_in_learner weighs the two).

The probe is the acting policy's pass (encoder, posterior step, actor) over one
update's worth of samples at once, timed on one thread and on every core. An
update runs each of those ops over the same samples forward and backward
(backward costs about twice the forward) and more besides (decoder, heads,
imagination), so three times the probe's gain is a lower bound on the update's
(on 64x64 pixels the probe gains what the encoder gains; the decoder's gain
comes on top). No weights change: the pass runs without autograd. How the
probe's figure compares with a whole update's gain: docs/PERFORMANCE.md.
"""

from __future__ import annotations

import statistics
import time

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

# An update repeats the policy pass's ops forward and backward over the same samples.
UPDATE_OVER_POLICY_PASS = 3
# Larger batches scale linearly and only lengthen the start-up (a size200m
# encoder at 256 samples takes seconds per pass on one core).
MAX_PROBE_SAMPLES = 256


@torch.no_grad()
def _median_pass_s(policy: TensorDictModuleBase, batch: TensorDictBase, reps: int) -> float:
    policy(batch.clone())  # the first call allocates
    times = []
    for _ in range(reps):
        inputs = batch.clone()
        start = time.perf_counter()
        policy(inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def update_thread_gain_s(policy: TensorDictModuleBase, policy_input: TensorDictBase, samples: int,
                         cores: int, reps: int = 3) -> float:
    """Seconds (at least) one update over ``samples`` sequence steps saves on ``cores``
    intra-op threads against one; 0 with one core, or where a second thread bought
    nothing. ``policy_input``: one step's input to ``policy`` (an env reset's
    tensordict), repeated to the probe's batch. The thread count is left as found."""
    if cores <= 1:
        return 0.0
    n = max(1, min(samples, MAX_PROBE_SAMPLES))
    batch = policy_input.reshape(-1)[:1].expand(n).clone()
    kept = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _median_pass_s(policy, batch, reps)
        torch.set_num_threads(cores)
        every = _median_pass_s(policy, batch, reps)
    finally:
        torch.set_num_threads(kept)
    return UPDATE_OVER_POLICY_PASS * max(0.0, one - every) * samples / n
