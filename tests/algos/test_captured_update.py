"""compile.update=captured on a GPU (dreamer/algos/update_paths.py, torchrl_ext/capture.py):
the whole V3 update replayed from a CUDA graph gives the eager update's numbers (its
eager body, its inductor-compiled body, discrete actions, pixels; seeded once, every
replay draws what an eager update draws), skips a non-finite batch inside the graph
with every running average left as it was, makes no host sync and no allocation per
update, captures again for a new batch shape, another (B, T) split of the same records
or a loaded checkpoint (and goes on from the loaded state), takes its inputs from the
staged replay's copy, and the acting policy (what collectors receive) reads the
parameters the graph updates; Dreamer V1's eager update is captured too."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tensordict import TensorDict

from dreamer.data.replay import make_replay_buffer, write
from dreamer.envs.factory import close_env, make_env
from tests.algos.update_helpers import assert_same_state, collected_batch, v3_config, v3_learner
from tests.support.batches import collector_batch
from tests.support.configs import tiny_config
from tests.support.gpu_checks import CAPTURED_UPDATE_CUDA
from tests.support.learners import learner_on

pytestmark = [pytest.mark.cuda(CAPTURED_UPDATE_CUDA), pytest.mark.usefixtures("single_thread")]

CUDA = torch.device("cuda")
WORLD_MODEL = ("encoder", "decoder", "prior", "posterior", "reward")


@pytest.fixture(scope="module")
def env():
    cfg = v3_config()
    env = make_env(cfg.env, cfg.algo, seed=0)
    yield env
    close_env(env)


def pair(env, *, compiled: bool = False, pixels: bool = False):
    """(eager losses_path learner, captured learner), the same weights, on the GPU, and a batch there.
    ``compiled``: the captured update compiled first (the eager backend: the eager draws)."""
    losses_path = v3_learner(v3_config(pixels=pixels), env, CUDA)
    captured = v3_learner(v3_config(update="captured", compiled=compiled, pixels=pixels), env, CUDA)
    captured.compile()
    batch = collected_batch(v3_config(pixels=pixels), env, CUDA)
    if compiled:
        captured.warmup(batch.clone())
    return losses_path, captured, batch


def update_both(losses_path, captured, batch, seed: int) -> None:
    for learner in (losses_path, captured):
        torch.manual_seed(seed)  # the CUDA generator too: a replay draws from its state now
        learner.update(batch.clone())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager-captured", "compiled-captured"])
def test_captured_updates_give_the_eager_updates_numbers(env, compiled):
    losses_path, captured, batch = pair(env, compiled=compiled)
    for seed in range(5):  # one warm-up update, the capture's, then replays
        update_both(losses_path, captured, batch, seed)
    assert captured.path.run.captures == 1 and captured.input_buffer() is not None
    torch.cuda.synchronize()
    assert_same_state(captured, losses_path)
    theirs, ours = losses_path.flush_metrics(), captured.flush_metrics()
    assert all(math.isfinite(v) for v in ours.values())
    for name in theirs:
        assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-6), name


def test_a_non_finite_batch_is_skipped_inside_the_graph(env):
    losses_path, captured, batch = pair(env)
    for seed in range(3):
        update_both(losses_path, captured, batch, seed)
    losses_path.flush_metrics(), captured.flush_metrics()
    before = {k: v.clone() for k, v in captured.models.modules.state_dict().items()}
    poisoned = batch.clone()
    poisoned["next", "reward"][0] = float("nan")
    update_both(losses_path, captured, poisoned, 3)
    after = captured.models.modules.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before if k.split(".")[0] in WORLD_MODEL)
    assert_same_state(captured, losses_path)
    assert captured.flush_metrics()["updates_skipped_nonfinite"] == 1
    update_both(losses_path, captured, batch, 4)  # a finite batch steps again
    assert not all(torch.equal(captured.models.modules.state_dict()[k], before[k]) for k in before)
    assert_same_state(captured, losses_path)


def test_a_captured_update_makes_no_host_sync_and_no_allocation(env):
    _, captured, batch = pair(env)
    for _ in range(2):
        captured.update(batch.clone())
    inputs = captured.input_buffer()
    assert inputs is not None
    inputs.update_(batch)
    torch.cuda.synchronize()
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            captured.update(inputs)  # what the replay hands over: the static inputs, filled in place
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocations
    assert all(math.isfinite(v) for v in captured.flush_metrics().values())


def test_a_new_batch_shape_and_a_loaded_checkpoint_capture_again(env):
    losses_path, captured, batch = pair(env)
    for seed in range(3):
        update_both(losses_path, captured, batch, seed)
    assert captured.path.run.captures == 1
    for learner in (losses_path, captured):  # half the sequences per update from here
        learner.batch_size //= 2
    half = batch[: batch.shape[0] // 2]
    for seed in range(3, 6):
        update_both(losses_path, captured, half, seed)
    assert captured.path.run.captures == 2
    assert_same_state(captured, losses_path)

    captured.load_state_dict(copy.deepcopy(losses_path.state_dict()))  # a resume: new optimiser state tensors
    assert captured.input_buffer() is None
    for seed in range(6, 9):
        update_both(losses_path, captured, half, seed)
    assert captured.path.run.captures == 3
    torch.cuda.synchronize()
    assert_same_state(captured, losses_path)


def test_collectors_acting_policy_reads_the_parameters_the_graph_updates(env):
    _, captured, batch = pair(env)
    acting = captured.models.policy(explore=True)  # what build_run hands the collectors
    learner_params = {p.data_ptr() for p in captured.models.modules.parameters()}
    policy_params = [p for p in TensorDict.from_module(acting).values(True, True) if isinstance(p, torch.nn.Parameter)]
    assert policy_params and all(p.data_ptr() in learner_params for p in policy_params)
    before = [p.detach().clone() for p in policy_params]
    for _ in range(4):  # warm-up, capture, two replays
        captured.update(batch.clone())
    assert captured.path.run.captures == 1
    pushed = [p.detach().to("cpu") for p in policy_params]  # what a weight push to CPU workers copies
    assert any(not torch.equal(b.cpu(), p) for b, p in zip(before, pushed)), "the replays moved no policy weight"
    by_address = {p.data_ptr(): p for p in captured.models.modules.parameters()}
    assert all(torch.equal(p, by_address[q.data_ptr()].detach().cpu()) for p, q in zip(pushed, policy_params))


@pytest.fixture
def deterministic_convolutions():
    """cuDNN's default weight-gradient kernels may add in any order: two learners fed the
    same pixels then differ by rounding, which LaProp's normalised steps blow up to a
    visible fraction of a step for near-zero gradients. Deterministic kernels, for both."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


@pytest.mark.usefixtures("deterministic_convolutions")
def test_samples_are_copied_by_the_replay_into_the_captured_inputs():
    cfg = v3_config(pixels=True)
    cfg.buffer.prefetch = 1
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        losses_path, captured, _ = pair(env, pixels=True)
    finally:
        close_env(env)
    replay = make_replay_buffer(cfg.buffer, CUDA)
    for traj in range(4):
        write(replay, collector_batch(traj_id=traj, first_step=0, steps=20), "pixels")
    for seed in range(2):  # warm-up and capture
        update_both(losses_path, captured, replay.sample(), seed)
    replay.deliver_into(captured.input_buffer())  # what the trainer does once captured
    for seed in range(2, 6):
        sample = replay.sample()
        assert sample is captured.input_buffer()
        reference = sample.clone()
        torch.manual_seed(seed)
        captured.update(sample)
        torch.manual_seed(seed)
        losses_path.update(reference)
    torch.cuda.synchronize()
    assert_same_state(captured, losses_path)


def test_dreamer_v1s_eager_update_captured_gives_the_eager_updates_numbers():
    """V1 has no compiled whole update (torch.optim.Adam.step breaks dynamo's graph), but
    its eager update, fused Adam included (capturable on this path), is captured as it is
    (compile=off), also after loading a losses_path run's checkpoint (capturable off in it)."""
    cfg = tiny_config()  # Dreamer V1, compile off
    losses_path, batch = learner_on(cfg, CUDA)
    captured_cfg = copy.deepcopy(cfg)
    captured_cfg.compile.update = "captured"
    captured, _ = learner_on(captured_cfg, CUDA)
    captured.compile()
    for seed in range(5):
        update_both(losses_path, captured, batch, seed)
    assert captured.path.run.captures == 1
    torch.cuda.synchronize()
    assert_same_state(captured, losses_path)
    captured.load_state_dict(copy.deepcopy(losses_path.state_dict()))  # a resume: new optimiser state tensors
    for seed in range(5, 9):
        update_both(losses_path, captured, batch, seed)
    assert captured.path.run.captures == 2
    torch.cuda.synchronize()
    assert_same_state(captured, losses_path)


def test_consecutive_replays_draw_what_eager_updates_draw(env):
    """Seeded once: every replay advances the CUDA generator as an eager update does, so the
    imagination's and the RSSM's draws of update N match without reseeding."""
    losses_path, captured, batch = pair(env)
    torch.manual_seed(0)
    losses_rng = None
    for learner in (losses_path, captured):
        torch.manual_seed(0)
        for _ in range(6):  # warm-up, capture, four replays
            learner.update(batch.clone())
        torch.cuda.synchronize()
        rng = torch.cuda.get_rng_state()
        losses_rng = rng if losses_rng is None else losses_rng
    assert captured.path.run.captures == 1
    assert torch.equal(rng, losses_rng)
    assert_same_state(captured, losses_path)


def test_the_inductor_compiled_body_captured_gives_the_eager_updates_numbers(env):
    """inductor's own kernels (fallback_random: its random ops draw as eager's do)."""
    losses_path = v3_learner(v3_config(), env, CUDA)
    cfg = v3_config(update="captured", compiled=True)
    cfg.compile.backend = "inductor"
    with torch._inductor.config.patch(fallback_random=True):
        captured = v3_learner(cfg, env, CUDA)
        captured.compile()
        batch = collected_batch(v3_config(), env, CUDA)
        captured.warmup(batch.clone())
        for seed in range(5):
            update_both(losses_path, captured, batch, seed)
    torch.cuda.synchronize()
    assert captured.path.run.captures == 1
    assert_same_state(captured, losses_path)


def test_a_resume_into_another_state_replays_from_the_loaded_one(env):
    """A checkpoint whose weights and moments differ from what the graph last held: the next
    updates start from the loaded state, not the captured one's."""
    losses_path, captured, batch = pair(env)
    for seed in range(4):
        update_both(losses_path, captured, batch, seed)
    other = v3_learner(v3_config(), env, CUDA)  # another history: other batches, other draws
    for seed in range(10, 13):
        torch.manual_seed(seed)
        other.update(collected_batch(v3_config(), env, CUDA)[torch.randperm(batch.shape[0], device=CUDA)])
    state = copy.deepcopy(other.state_dict())
    losses_path.load_state_dict(copy.deepcopy(state))
    captured.load_state_dict(state)
    for seed in range(20, 24):
        update_both(losses_path, captured, batch, seed)
    torch.cuda.synchronize()
    assert captured.path.run.captures == 2
    assert_same_state(captured, losses_path)


def test_another_sequence_split_of_the_same_batch_captures_again(env):
    """(B, T) is part of the capture's key: 2 x 5 and 1 x 10 records have the same layout."""
    losses_path, captured, batch = pair(env)
    for seed in range(3):
        update_both(losses_path, captured, batch, seed)
    for learner in (losses_path, captured):
        learner.batch_size, learner.batch_length = learner.batch_size // 2, learner.batch_length * 2
    for seed in range(3, 6):
        update_both(losses_path, captured, batch, seed)
    torch.cuda.synchronize()
    assert captured.path.run.captures == 2
    assert_same_state(captured, losses_path)


def test_a_skipped_update_moves_no_running_average_in_the_graph(env):
    losses_path, captured, batch = pair(env)
    for seed in range(3):
        update_both(losses_path, captured, batch, seed)
    slow = captured.value_loss.target_value_model_params
    before = [t.clone() for t in [*slow.values(True, True), *captured._statistics()]]
    poisoned = batch.clone()
    poisoned["next", "reward"][0] = float("nan")
    update_both(losses_path, captured, poisoned, 3)
    torch.cuda.synchronize()
    after = [*slow.values(True, True), *captured._statistics()]
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    assert_same_state(captured, losses_path)


def test_discrete_actions_captured_give_the_eager_updates_numbers():
    cfg = v3_config(discrete=True)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        losses_path = v3_learner(v3_config(discrete=True), env, CUDA)
        captured = v3_learner(v3_config(discrete=True, update="captured"), env, CUDA)
        captured.compile()
        batch = collected_batch(cfg, env, CUDA)
    finally:
        close_env(env)
    for seed in range(5):
        update_both(losses_path, captured, batch, seed)
    torch.cuda.synchronize()
    assert captured.path.run.captures == 1
    assert_same_state(captured, losses_path)
