"""dreamer/data/replay.py and torchrl_ext/replay.py: what is stored (a record per
observation, reset observations included, each frame once), how it is written, and
how sequences are sampled: any start, across episode ends, one env's stream each."""

from __future__ import annotations

import os
import random
import threading

import numpy as np
import pytest
import tensordict
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, RoundRobinWriter, TensorDictReplayBuffer

from dreamer.data import replay as dreamer_replay
from dreamer.data.replay import (
    STEP_KEY,
    STREAM_KEY,
    bytes_per_step,
    check_capacity,
    load_replay_state,
    make_replay_buffer,
    replay_state,
    stored_keys,
    write,
)
from dreamer.envs.keys import IS_FIRST
from dreamer.errors import UserError
from tests.support.batches import collector_batch
from tests.support.configs import tiny_config
from tests.support.fake_cuda import FakeCuda
from tests.support.gpu_checks import PAGE_LOCKED_STAGED_REPLAY, REPLAY_CUDA, REPLAY_SIZE_PER_NODE
from torchrl_ext import WORKER_KEY, PlainWriteReplayBuffer, SliceCursorWriter, StagedDeviceReplayBuffer
from torchrl_ext.intra_op import use_one_intra_op_thread

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CPU = torch.device("cpu")


def _pixel_buffer(capacity=200, batch_size=2, batch_length=5, prefetch=0):
    cfg = tiny_config(pixels=True)
    cfg.buffer.capacity = capacity
    cfg.buffer.batch_size = batch_size
    cfg.buffer.batch_length = batch_length
    cfg.buffer.prefetch = prefetch
    return cfg, make_replay_buffer(cfg.buffer, CPU)


def _storage_td(rb) -> TensorDict:
    return rb.storage._storage


# -- what is stored --------------------------------------------------------------


def test_storage_holds_a_record_per_observation_with_uint8_pixels_once():
    """Two episodes' first 20 transitions: each episode's reset observation is a record of
    its own (is_first, no action, reward 0), then one record per transition; every frame is
    stored once, and nothing the learner does not read (policy outputs, carries, root copies)."""
    cfg, rb = _pixel_buffer()
    b0 = collector_batch(traj_id=0, first_step=0, steps=20)
    b1 = collector_batch(traj_id=1, first_step=0, steps=20)
    assert write(rb, b0, "pixels") == 20  # agent steps
    assert write(rb, b1, "pixels") == 20
    assert len(rb) == 42  # records: 2 reset observations + 40 transitions

    stored = _storage_td(rb)
    keys = set(stored.keys(include_nested=True, leaves_only=True))
    assert keys == set(stored_keys("pixels"))
    assert "pixels" not in stored.keys()
    for extra in ("loc", "scale", "state", "belief", ("next", "belief"), ("next", "step_count")):
        assert extra not in keys

    frames = stored["next", "pixels"]
    assert frames.dtype == torch.uint8 and frames.shape[1:] == (64, 64, 3)
    for start, batch in ((0, b0), (21, b1)):
        torch.testing.assert_close(frames[start], batch["pixels"][0])  # the reset observation
        torch.testing.assert_close(frames[start + 1:start + 21], batch["next", "pixels"])
        torch.testing.assert_close(stored["action"][start + 1:start + 21], batch["action"])
        assert stored["action"][start].abs().sum() == 0 and stored["next", "reward"][start].item() == 0
    first = stored[IS_FIRST][:42].reshape(-1)
    assert first.nonzero().reshape(-1).tolist() == [0, 21]
    assert not stored["next", "done"][:42].any()


def test_an_episode_ending_inside_a_batch_is_followed_by_the_next_ones_reset_record():
    _, rb = _pixel_buffer()
    batch = collector_batch(traj_id=0, first_step=5, steps=10)
    batch["step_count"][6:] = torch.arange(4).unsqueeze(-1)  # the env reset after transition 5
    batch["next", "done"][5] = batch["next", "terminated"][5] = True
    write(rb, batch, "pixels")
    stored = _storage_td(rb)
    assert len(rb) == 11
    assert stored[IS_FIRST][:11].reshape(-1).nonzero().reshape(-1).tolist() == [6]
    assert stored["next", "done"][:11].reshape(-1).nonzero().reshape(-1).tolist() == [5]
    torch.testing.assert_close(stored["next", "pixels"][6], batch["pixels"][6])  # the reset's frame
    torch.testing.assert_close(stored["next", "pixels"][7:11], batch["next", "pixels"][6:])


def test_each_workers_batches_form_its_own_numbered_stream():
    _, rb = _pixel_buffer()
    for worker, first in ((1, 0), (0, 0), (1, 10), (0, 10)):
        batch = collector_batch(traj_id=worker, first_step=first, steps=10, frame=8)
        batch[WORKER_KEY] = torch.full((10,), worker)
        write(rb, batch, "pixels")
    stored = _storage_td(rb)
    n = len(rb)
    for worker in (0, 1):
        mine = stored[STREAM_KEY][:n] == worker
        assert stored[STEP_KEY][:n][mine].tolist() == list(range(21))  # a reset record + 20 transitions


def test_write_takes_a_by_env_batch_as_one_stream_per_env():
    _, rb = _pixel_buffer()
    batches = [collector_batch(traj_id=w, first_step=1, steps=10) for w in range(3)]
    stacked = torch.stack(batches)  # (envs, time), mid-episode: no reset records
    assert write(rb, stacked, "pixels") == 30
    stored = _storage_td(rb)
    torch.testing.assert_close(stored["next", "pixels"][:30], stacked["next", "pixels"].reshape(30, 64, 64, 3))
    assert stored[STREAM_KEY][:30].tolist() == [e for e in range(3) for _ in range(10)]


def test_bytes_per_step_counts_what_a_record_stores():
    step = collector_batch(traj_id=0, first_step=0, steps=1)[0]
    _, rb = _pixel_buffer()
    write(rb, collector_batch(traj_id=0, first_step=1, steps=1), "pixels")
    record = _storage_td(rb)[0]
    assert bytes_per_step(step, "pixels") == sum(t.numel() * t.element_size() for t in record.values(True, True))
    # The frame itself, once.
    assert 64 * 64 * 3 <= bytes_per_step(step, "pixels") < 2 * 64 * 64 * 3


def test_sample_is_batch_size_times_batch_length_on_cpu():
    cfg, rb = _pixel_buffer()
    write(rb, collector_batch(traj_id=0, first_step=0, steps=20), "pixels")
    sample = rb.sample()
    assert sample.shape == (cfg.buffer.batch_size * cfg.buffer.batch_length,)
    assert sample["next", "pixels"].dtype == torch.uint8
    assert sample["next", "pixels"].device == CPU


# -- SliceCursorWriter -----------------------------------------------------------


def _step(i: int) -> TensorDict:
    return TensorDict(
        {
            "obs": torch.full((3,), float(i)),
            "next": {"pixels": torch.full((4, 4, 3), i % 256, dtype=torch.uint8)},
        },
        batch_size=[],
    )


@pytest.fixture
def write_spies(monkeypatch):
    """Counts direct stacks onto storage and any materialising copy of a lazy stack."""
    counts = {"stack_onto": 0, "materialising_stack": 0, "contiguous": 0, "update_at": 0}
    stack_onto = tensordict.TensorDict._stack_onto_

    def spy_stack_onto(self, *args, **kwargs):
        counts["stack_onto"] += 1
        return stack_onto(self, *args, **kwargs)

    torch_stack = torch.stack

    def spy_stack(tensors, *args, **kwargs):
        tensors = list(tensors)
        # A stack of plain tensors without out= allocates a temporary copy.
        if kwargs.get("out") is None and tensors and isinstance(tensors[0], torch.Tensor):
            counts["materialising_stack"] += 1
        return torch_stack(tensors, *args, **kwargs)

    contiguous = LazyStackedTensorDict.contiguous

    def spy_contiguous(self, *args, **kwargs):
        counts["contiguous"] += 1
        return contiguous(self, *args, **kwargs)

    update_at = tensordict.TensorDict.update_at_

    def spy_update_at(self, *args, **kwargs):
        counts["update_at"] += 1
        return update_at(self, *args, **kwargs)

    monkeypatch.setattr(tensordict.TensorDict, "_stack_onto_", spy_stack_onto)
    monkeypatch.setattr(torch, "stack", spy_stack)
    monkeypatch.setattr(LazyStackedTensorDict, "contiguous", spy_contiguous)
    monkeypatch.setattr(tensordict.TensorDict, "update_at_", spy_update_at)
    return counts


def _expected_ring(capacity: int, values: list[int]) -> list[int]:
    ring = [None] * capacity
    for pos, v in enumerate(values):
        ring[pos % capacity] = v
    return ring


def test_lazy_stack_is_written_by_a_direct_stack_onto_storage(write_spies):
    capacity = 7  # not a multiple of the write size: the third write wraps
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), writer=SliceCursorWriter())
    written = []
    for n in (3, 3, 3, 2):
        items = [_step(len(written) + j) for j in range(n)]
        written += [len(written) + j for j in range(n)]
        rb.extend(LazyStackedTensorDict.lazy_stack(items, dim=0))

    assert write_spies["stack_onto"] > 0
    assert write_spies["materialising_stack"] == 0
    assert write_spies["contiguous"] == 0
    assert write_spies["update_at"] == 0

    ring = _expected_ring(capacity, written)
    stored = _storage_td(rb)
    assert stored["obs"][:, 0].tolist() == [float(v) for v in ring]
    assert stored["next", "pixels"][:, 0, 0, 0].tolist() == ring
    assert len(rb) == capacity


def test_plain_write_buffer_skips_the_per_step_clone_and_stores_the_same(monkeypatch):
    """No transform, no priorities: extend goes straight to the writer (no
    shallow clone of every step, no "index" entry) and stores what upstream does."""
    clones = {"n": 0}
    clone = tensordict.TensorDict._clone

    def spy_clone(self, *args, **kwargs):
        clones["n"] += 1
        return clone(self, *args, **kwargs)

    monkeypatch.setattr(tensordict.TensorDict, "_clone", spy_clone)
    stored = {}
    for cls in (PlainWriteReplayBuffer, TensorDictReplayBuffer):
        rb = cls(storage=LazyTensorStorage(7), writer=SliceCursorWriter())
        clones["n"] = 0
        for first in (0, 4, 8):  # the third write wraps around the ring
            steps = [_step(first + j) for j in range(4)]
            index = rb.extend(LazyStackedTensorDict.lazy_stack(steps, dim=0))
            assert "index" not in steps[0].keys()
        n_clones = clones["n"]
        stored[cls] = (_storage_td(rb).clone(), index, n_clones)
    plain, upstream = stored[PlainWriteReplayBuffer], stored[TensorDictReplayBuffer]
    assert plain[2] == 0 and upstream[2] >= 12  # upstream clones every step
    assert (plain[0] == upstream[0]).all()
    assert plain[1].tolist() == upstream[1].tolist()


def test_plain_write_buffer_still_applies_a_write_transform():
    from torchrl.envs.transforms import Transform

    class DoubleOnWrite(Transform):
        def _inv_apply_transform(self, obs):
            return obs * 2

    rb = PlainWriteReplayBuffer(
        storage=LazyTensorStorage(8), writer=SliceCursorWriter(),
        transform=DoubleOnWrite(in_keys_inv=["obs"], out_keys_inv=["obs"]),
    )
    rb.extend(LazyStackedTensorDict.lazy_stack([_step(j) for j in range(3)], dim=0))
    assert _storage_td(rb)["obs"][:3, 0].tolist() == [0.0, 2.0, 4.0]


def test_a_sample_side_device_move_keeps_the_direct_write_path(monkeypatch):
    """On a GPU learner the buffer moves sampled batches to the device through a plain
    callable transform; its inverse is the identity, so writes still skip upstream's
    per-step clone and go straight to the writer (the direct stack)."""
    rb = PlainWriteReplayBuffer(storage=LazyTensorStorage(8), writer=SliceCursorWriter(),
                                transform=lambda batch: batch.to("cpu"))

    def upstream_extend(*args, **kwargs):
        raise AssertionError("the write took upstream's extend (per-step clone + transform.inv)")

    monkeypatch.setattr(TensorDictReplayBuffer, "extend", upstream_extend)
    rb.extend(LazyStackedTensorDict.lazy_stack([_step(j) for j in range(3)], dim=0))
    assert _storage_td(rb)["obs"][:3, 0].tolist() == [0.0, 1.0, 2.0]
    assert rb.sample(2)["obs"].shape == (2, 3)  # the sample side still applies it


def test_list_of_steps_is_written_by_a_direct_stack_onto_storage(write_spies):
    capacity = 5
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), writer=SliceCursorWriter())
    written = []
    for n in (2, 4):  # the second write wraps around the ring
        items = [_step(100 + len(written) + j) for j in range(n)]
        written += [100 + len(written) + j for j in range(n)]
        rb.extend(items)
    assert write_spies["stack_onto"] > 0
    assert write_spies["materialising_stack"] == 0
    stored = rb.storage._storage
    assert stored["obs"][:, 0].tolist() == [float(v) for v in _expected_ring(capacity, written)]


def test_dense_batch_write_wraps_around_the_ring():
    capacity = 13
    cfg, rb = _pixel_buffer(capacity=capacity, batch_length=5)
    # Mid-episode batches (no reset records): 20 records > 13.
    batches = [collector_batch(traj_id=i, first_step=1, steps=5) for i in range(4)]
    for b in batches:
        write(rb, b, "pixels")
    all_frames = torch.cat([b["next", "pixels"] for b in batches])
    expected = torch.empty(capacity, 64, 64, 3, dtype=torch.uint8)
    for pos in range(all_frames.shape[0]):
        expected[pos % capacity] = all_frames[pos]
    assert torch.equal(_storage_td(rb)["next", "pixels"], expected)
    assert rb.writer._cursor == 20 % capacity
    assert len(rb) == capacity


@pytest.mark.parametrize("lazy", [False, True])
def test_indices_and_write_count_match_round_robin_writer(lazy):
    capacity = 7
    ours = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), writer=SliceCursorWriter())
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), writer=RoundRobinWriter())
    counter = 0
    for n in (3, 3, 1, 7, 4, 5, 2):
        items = [_step(counter + j) for j in range(n)]
        counter += n

        def data():
            td = [i.clone() for i in items]
            return LazyStackedTensorDict.lazy_stack(td, 0) if lazy else torch.stack(td)

        idx_ours = ours.extend(data())
        idx_ref = ref.extend(data())
        assert torch.equal(idx_ours, idx_ref), (n, idx_ours, idx_ref)
        assert ours.writer._write_count == ref.writer._write_count
        assert ours.writer._cursor == ref.writer._cursor
        assert len(ours) == len(ref)
        assert ours.storage._last_cursor_index == ref.storage._last_cursor_index
        filled = len(ref)  # rows past the fill level are uninitialised memory
        assert torch.equal(_storage_td(ours)["obs"][:filled], _storage_td(ref)["obs"][:filled])
        assert torch.equal(
            _storage_td(ours)["next", "pixels"][:filled], _storage_td(ref)["next", "pixels"][:filled]
        )


def test_write_larger_than_capacity_matches_round_robin_writer():
    capacity = 4
    ours = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), writer=SliceCursorWriter())
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), writer=RoundRobinWriter())
    for n in (3, 6):
        data = torch.stack([_step(j) for j in range(n)])
        assert torch.equal(ours.extend(data.clone()), ref.extend(data.clone()))
        assert ours.writer._write_count == ref.writer._write_count
        assert ours.writer._cursor == ref.writer._cursor


# -- sampler ---------------------------------------------------------------------


def _check_sequences(sample, batch_size, batch_length):
    """One stream per sequence, its records consecutive (the stream's own numbering:
    so never across the ring's write cursor, where the newest meet the oldest)."""
    seqs = sample.reshape(batch_size, batch_length)
    stream = seqs[STREAM_KEY]
    steps = seqs[STEP_KEY]
    assert (stream == stream[:, :1]).all(), f"a sequence mixes two envs' streams:\n{stream}"
    assert (steps.diff(dim=1) == 1).all(), f"a sequence is not consecutive records of its stream:\n{steps}"


def _worker_batch(worker: int, first_step: int, steps: int = 20, episode: int = 6) -> TensorDict:
    """A worker's batch whose env resets every ``episode`` steps."""
    batch = collector_batch(traj_id=worker, first_step=first_step, steps=steps, frame=8)
    count = (torch.arange(first_step, first_step + steps) % episode).unsqueeze(-1)
    batch["step_count"] = count
    batch["next", "done"] = batch["next", "terminated"] = count == episode - 1
    batch[WORKER_KEY] = torch.full((steps,), worker)
    return batch


@pytest.mark.parametrize(
    "capacity, prefetch, order",
    [
        (1000, 0, "alternate"),  # never full
        (130, 0, "alternate"),  # wraps; capacity not a multiple of the batches
        (130, 0, "random"),  # async workers: any interleaving
        (130, 2, "random"),  # with the prefetch thread of the default config
    ],
)
def test_sampled_sequences_follow_one_stream_across_episode_ends(capacity, prefetch, order):
    batch_size, batch_length = 6, 9  # longer than the 6-step episodes
    _, rb = _pixel_buffer(capacity=capacity, batch_size=batch_size, batch_length=batch_length,
                          prefetch=prefetch)
    rng = random.Random(0)
    next_step = {0: 0, 1: 0}
    crossed = 0
    for i in range(24):
        w = i % 2 if order == "alternate" else rng.randrange(2)
        write(rb, _worker_batch(w, next_step[w]), "pixels")
        next_step[w] += 20
        for _ in range(2):
            sample = rb.sample()
            _check_sequences(sample, batch_size, batch_length)
            crossed += int(sample[IS_FIRST].reshape(batch_size, batch_length)[:, 1:].any(1).sum())
    assert crossed > 0  # sequences do run into the next episode
    # Prefetched samples still being drawn would consume the global RNG during the next test.
    for future in tuple(rb._prefetch_queue):
        future.result()


def _random_cartpole_steps(steps: int, seed: int = 0) -> list[TensorDict]:
    """Random-action CartPole-v1 as a collector hands it over, in 100-step batches."""
    import gymnasium

    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    rows, count = [], 0
    rng = random.Random(seed)
    for _ in range(steps):
        action = rng.randrange(2)
        nxt, reward, terminated, truncated, _ = env.step(action)
        rows.append((obs, action, nxt, reward, terminated, truncated, count))
        count += 1
        obs = nxt
        if terminated or truncated:
            obs, _ = env.reset()
            count = 0
    batches = []
    for start in range(0, steps, 100):
        chunk = rows[start:start + 100]
        n = len(chunk)
        flag = lambda i: torch.tensor([[bool(r[i])] for r in chunk])  # noqa: E731
        batches.append(TensorDict({
            "observation": torch.tensor(np.stack([r[0] for r in chunk])),
            "action": torch.nn.functional.one_hot(torch.tensor([r[1] for r in chunk]), 2).float(),
            "step_count": torch.tensor([[r[6]] for r in chunk]),
            "next": {
                "observation": torch.tensor(np.stack([r[2] for r in chunk])),
                "reward": torch.tensor([[r[3]] for r in chunk], dtype=torch.float32),
                "terminated": flag(4), "truncated": flag(5), "done": flag(4) | flag(5),
            },
        }, batch_size=[n]))
    return batches


@pytest.mark.parametrize("batch_length", [16, 64])
def test_episode_ends_are_sampled_at_their_share_of_storage(batch_length):
    """Random CartPole episodes last ~22 steps: at 64 almost none is as long as a sequence.
    Terminal records are drawn at their share of the stored records (within 15%)."""
    cfg = tiny_config()
    b = cfg.buffer
    b.capacity, b.batch_size, b.batch_length, b.prefetch = 30_000, 16, batch_length, 0
    rb = make_replay_buffer(cfg.buffer, CPU)
    for batch in _random_cartpole_steps(20_000):
        write(rb, batch, "observation")
    stored = _storage_td(rb)[: len(rb)]
    stored_share = stored["next", "terminated"].float().mean().item()
    torch.manual_seed(0)
    drawn = torch.cat([rb.sample()["next", "terminated"].reshape(-1) for _ in range(400)])
    assert drawn.float().mean().item() == pytest.approx(stored_share, rel=0.15)


def test_every_stored_record_is_reachable():
    batch_size, batch_length = 16, 16
    _, rb = _pixel_buffer(capacity=400, batch_size=batch_size, batch_length=batch_length)
    next_step = {0: 0, 1: 0}
    for w in (0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1):  # wraps the ring: 14 x ~23 records > 400
        write(rb, _worker_batch(w, next_step[w]), "pixels")
        next_step[w] += 20
    torch.manual_seed(0)
    seen = set()
    for _ in range(600):
        sample, info = rb.sample(return_info=True)
        _check_sequences(sample, batch_size, batch_length)
        seen.update(info["index"].reshape(-1).tolist())
    assert seen == set(range(len(rb)))


def test_a_resumed_replay_samples_the_sequences_it_would_have(tmp_path):
    """Its own generator and one prefetch thread: the sequences drawn after a save and
    load are the ones the saved buffer draws next, prefetched batches included, whatever
    else draws from torch's global generator meanwhile."""
    cfg = tiny_config(pixels=True)
    b = cfg.buffer
    b.capacity, b.batch_size, b.batch_length, b.prefetch = 150, 4, 7, 2
    rb = make_replay_buffer(b, CPU, seed=3)
    next_step = {0: 0, 1: 0, 2: 0}
    for w in (0, 1, 2, 1, 0, 2, 2, 1, 0):  # wraps the ring
        write(rb, _worker_batch(w, next_step[w], episode=9), "pixels")
        next_step[w] += 20
    rb.sample()  # the prefetch queue is in flight
    path = tmp_path / "replay.pt"
    torch.save(replay_state(rb), path)
    expected = []
    for _ in range(5):
        torch.rand(100)  # the learner's draws
        expected.append(rb.sample()[STEP_KEY].clone())

    restored = make_replay_buffer(b, CPU, seed=99)  # the generator's state comes from the checkpoint
    load_replay_state(restored, torch.load(path, weights_only=True))
    resumed = [restored.sample()[STEP_KEY] for _ in range(5)]
    assert all(torch.equal(a, c) for a, c in zip(expected, resumed))
    for buffer in (rb, restored):
        for future in tuple(buffer._prefetch_queue):
            future.result()


def _threads_in_this_process() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/task"))


@pytest.mark.gpu_acceptance(PAGE_LOCKED_STAGED_REPLAY)
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_prefetch_threads_sample_a_large_storage_without_an_openmp_team_of_their_own():
    """Past ATen's grain (32,768 steps) the sampler's scan over the storage runs in
    parallel; a prefetch thread doing that with the learner's count starts OpenMP
    workers of its own, and with more of them than cores the learner's team stops
    spinning and slows (torchrl_ext/intra_op.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _, rb = _pixel_buffer(capacity=50_000, batch_size=4, batch_length=8, prefetch=2)
        for k in range(4):
            write(rb, collector_batch(traj_id=k, first_step=0, steps=10_000, frame=8), "pixels")
        torch.exp(torch.zeros(1_000_000))  # the main thread's own team exists before the count
        before = _threads_in_this_process()
        for _ in range(8):
            rb.sample()
        for future in tuple(rb._prefetch_queue):
            future.result()
        assert _threads_in_this_process() - before <= 2  # the two prefetch threads, no OpenMP worker of theirs
        assert torch.get_num_threads() == 2  # the learner's count is untouched
    finally:
        torch.set_num_threads(threads)


def test_one_intra_op_thread_is_the_calling_threads_alone():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []
    try:
        helper = threading.Thread(target=lambda: seen.append((use_one_intra_op_thread(), torch.get_num_threads())))
        helper.start()
        helper.join()
        assert seen == [(True, 1)]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


# -- capacity check --------------------------------------------------------------


def _host_memory(monkeypatch, available: int, limited_by: str = "free RAM"):
    monkeypatch.setattr(dreamer_replay, "host_memory_available", lambda: (available, limited_by))


def _suggested(message: str) -> int:
    return int(message.rsplit("<=", 1)[1])


def test_check_capacity_refuses_a_buffer_larger_than_free_ram(monkeypatch):
    cfg = tiny_config(pixels=True)
    cfg.buffer.capacity = 1_000_000
    step_bytes = 64 * 64 * 3 + 32
    free = 2 * 2**30
    _host_memory(monkeypatch, free)
    with pytest.raises(UserError) as err:
        check_capacity(cfg.buffer, step_bytes)
    msg = str(err.value)
    assert "buffer.capacity" in msg and "(free RAM)" in msg
    # The suggested capacity fits.
    assert 0 < _suggested(msg) * step_bytes <= free


def test_check_capacity_accepts_a_buffer_that_fits(monkeypatch):
    cfg = tiny_config(pixels=True)
    cfg.buffer.capacity = 1000
    _host_memory(monkeypatch, 2**40)
    assert check_capacity(cfg.buffer, 100) == 1000 * 100


@pytest.mark.gpu_acceptance(REPLAY_SIZE_PER_NODE)
def test_check_capacity_counts_every_learner_on_the_node_against_the_cgroup_limit(monkeypatch):
    """Eight torchrun ranks on one node each hold a buffer: what fits one learner can
    be 8x too much for the node, and a SLURM job's cgroup may allow less than the
    node's free RAM."""
    cfg = tiny_config(pixels=True)
    cfg.buffer.capacity = 100_000
    step_bytes = 12_320
    need = cfg.buffer.capacity * step_bytes  # 1.15 GiB: fits one learner
    _host_memory(monkeypatch, 4 * 2**30, "the cgroup memory limit of 8.0 GiB")
    assert check_capacity(cfg.buffer, step_bytes, ranks_per_node=1) == need
    with pytest.raises(UserError) as err:
        check_capacity(cfg.buffer, step_bytes, ranks_per_node=8)
    msg = str(err.value)
    assert "x 8 learners on this node" in msg and "the cgroup memory limit of 8.0 GiB" in msg
    assert 8 * _suggested(msg) * step_bytes <= 0.8 * 4 * 2**30


@pytest.mark.gpu_acceptance(REPLAY_SIZE_PER_NODE)
def test_check_capacity_of_storage_on_a_gpu_is_against_its_free_memory(monkeypatch):
    cfg = tiny_config(pixels=True)
    cfg.buffer.capacity = 100_000
    monkeypatch.setattr(dreamer_replay, "host_memory_available",
                        lambda: pytest.fail("storage on a GPU was checked against host RAM"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2**30, 80 * 2**30))
    gpu = torch.device("cuda", 1)
    assert check_capacity(cfg.buffer, 1000, storage_device=gpu) == 100_000 * 1000
    with pytest.raises(UserError) as err:
        check_capacity(cfg.buffer, 100_000, storage_device=gpu)
    msg = str(err.value)
    assert "on cuda:1" in msg and "1.0 GiB of its memory is free" in msg
    assert _suggested(msg) * 100_000 <= 0.8 * 2**30


def test_pin_memory_on_without_cuda_is_a_user_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = tiny_config()
    cfg.buffer.pin_memory = "on"
    with pytest.raises(UserError, match="buffer.pin_memory"):
        make_replay_buffer(cfg.buffer, CPU)


def test_a_replay_with_prefetched_batches_saves_as_tensors_and_plain_types(tmp_path):
    """checkpoint.replay=true: upstream's state keeps prefetched TensorDicts; the
    checkpoint must still load with weights_only=True and restore them."""
    from dreamer.data.replay import load_replay_state, replay_state

    cfg, rb = _pixel_buffer(prefetch=2)
    write(rb, collector_batch(traj_id=0, first_step=0, steps=40), "pixels")
    rb.sample()  # fills the prefetch queue
    path = tmp_path / "replay.pt"
    torch.save(replay_state(rb), path)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    _, restored = _pixel_buffer(prefetch=2)
    load_replay_state(restored, torch.load(path, weights_only=True))
    assert len(restored) == len(rb)
    assert torch.equal(restored.sample()["action"], rb.sample()["action"])  # the same prefetched batch first
    write(restored, collector_batch(traj_id=1, first_step=1, steps=10), "pixels")  # the storage keeps its shape
    assert len(restored) == len(rb) + 10


# -- page-locked storage, staged samples on a GPU learner (CUDA stood in for) ------

CUDA = torch.device("cuda")


@pytest.fixture
def fake_cuda(monkeypatch):
    return FakeCuda(monkeypatch)


@pytest.fixture
def pin_copies(monkeypatch):
    """Counts pin_memory() calls: each is a copy into the caching host allocator."""
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *a, **k: calls.append(t.shape) or t.clone())
    monkeypatch.setattr(tensordict.TensorDictBase, "pin_memory",
                        lambda td, *a, **k: calls.append(td.shape) or td.clone())
    return calls


def _filled(rb, steps_per_traj=20, trajs=4):
    for traj in range(trajs):
        write(rb, collector_batch(traj_id=traj, first_step=0, steps=steps_per_traj), "pixels")
    return rb


@pytest.mark.gpu_acceptance(PAGE_LOCKED_STAGED_REPLAY)
def test_pinned_storage_locks_exactly_its_bytes_in_place(fake_cuda, pin_copies):
    """buffer.pin_memory: the storage is allocated page-locked at the first write, as
    many bytes as it holds (64-byte aligned leaves), not pin_memory()'s copy into the
    caching host allocator that rounds each block up to a power of two; unlocked
    when the buffer is freed."""
    import gc
    import math
    import mmap

    cfg = tiny_config(pixels=True)
    cfg.buffer.capacity, cfg.buffer.pin_memory, cfg.buffer.prefetch = 1000, "on", 0
    rb = make_replay_buffer(cfg.buffer, CPU)
    batch = collector_batch(traj_id=0, first_step=0, steps=20)
    write(rb, batch, "pixels")
    leaves = list(_storage_td(rb).values(True, True))
    locked = sum(fake_cuda.registered.values())
    exact = cfg.buffer.capacity * bytes_per_step(batch[0], "pixels")
    assert len(fake_cuda.registered) == len(leaves)  # one mapping per leaf
    assert exact <= locked < exact + mmap.PAGESIZE * len(leaves)
    assert locked < sum(2 ** math.ceil(math.log2(t.numel() * t.element_size())) for t in leaves)
    assert all(fake_cuda.page_locked(t) for t in leaves)
    assert pin_copies == []
    torch.testing.assert_close(_storage_td(rb)["next", "pixels"][1:21], batch["next", "pixels"])
    addresses = set(fake_cuda.registered)
    del rb, leaves
    gc.collect()
    assert set(fake_cuda.unregistered) == addresses and fake_cuda.registered == {}


@pytest.mark.gpu_acceptance(PAGE_LOCKED_STAGED_REPLAY)
def test_a_restored_pinned_replay_is_page_locked_again(fake_cuda, pin_copies, tmp_path):
    from dreamer.data.replay import load_replay_state, replay_state

    cfg = tiny_config(pixels=True)
    cfg.buffer.capacity, cfg.buffer.pin_memory, cfg.buffer.prefetch = 300, "on", 0
    rb = _filled(make_replay_buffer(cfg.buffer, CPU))
    torch.save(replay_state(rb), tmp_path / "replay.pt")
    restored = make_replay_buffer(cfg.buffer, CPU)
    load_replay_state(restored, torch.load(tmp_path / "replay.pt", weights_only=True))
    assert all(fake_cuda.page_locked(t) for t in _storage_td(restored).values(True, True))
    assert (_storage_td(restored)[:len(rb)] == _storage_td(rb)[:len(rb)]).all()
    assert pin_copies == []


@pytest.mark.gpu_acceptance(PAGE_LOCKED_STAGED_REPLAY)
@pytest.mark.parametrize("pin", ["on", "off"])
def test_a_gpu_learner_gets_the_samples_upstream_would_give(fake_cuda, pin):
    """Same sampler draws, same batch: data and the sampler's entries (index,
    sequence-end truncation) as upstream's TensorDictReplayBuffer.sample sets them."""
    cfg, reference = _pixel_buffer(batch_size=3, batch_length=5)
    cfg.buffer.pin_memory = pin
    staged = make_replay_buffer(cfg.buffer, CUDA)
    assert isinstance(staged, StagedDeviceReplayBuffer)
    _filled(reference), _filled(staged)
    for seed in range(6):
        torch.manual_seed(seed)
        want = reference.sample()
        torch.manual_seed(seed)
        got = staged.sample()
        assert set(got.keys(True, True)) == set(want.keys(True, True))
        assert (got == want).all(), seed


@pytest.mark.gpu_acceptance(PAGE_LOCKED_STAGED_REPLAY)
def test_staged_sampling_gathers_into_reused_staging_batches_and_waits_on_events_not_the_host(
        fake_cuda, pin_copies, monkeypatch):
    """The GPU path, step by step: each sample is gathered straight into one of two
    preallocated page-locked staging batches (no allocation, no pin copy); copied
    with non_blocking on a side stream; an event after the copy is what the learner's
    stream waits on (the host does not), and the returned tensors are marked used on
    the learner's stream; a staging batch is overwritten only after the host waited
    for the event of the copy that last read it."""
    cfg, _ = _pixel_buffer(batch_size=3, batch_length=5)
    rb = _filled(make_replay_buffer(cfg.buffer, CUDA))  # buffer.pin_memory=auto: pinned on CUDA
    slots = rb.staging.slots
    assert len(slots) == 2

    overwritten_unsafely = []
    index_select = torch.index_select

    def spy_index_select(source, dim, index, *, out=None):
        last_read = fake_cuda.last_copy_out_of(out)
        if last_read is not None and not last_read.synchronized:
            overwritten_unsafely.append(out.shape)
        return index_select(source, dim, index, out=out)

    monkeypatch.setattr(torch, "index_select", spy_index_select)
    samples = []
    for _ in range(6):
        fake_cuda.log.clear()
        sample = rb.sample()
        samples.append(sample)
        [copy] = fake_cuda.events("copy")
        assert copy == ("copy", "side", True)
        [(_, stream, event)] = fake_cuda.events("record")
        assert stream == "side" and event.after_copy_of  # recorded after the copy
        assert fake_cuda.events("wait_event") == [("wait_event", "default", event)]
        marked = {ptr for _, stream, ptr in fake_cuda.events("record_stream") if stream == "default"}
        assert marked == {t.data_ptr() for t in sample.values(True, True)}
    staged_memory = {t.data_ptr() for s in slots for t in s.batch.values(True, True)}
    assert all(fake_cuda.page_locked(t) for s in slots for t in s.batch.values(True, True))
    for sample in samples:  # handed out: the device copies, never the staging batches
        assert not staged_memory & {t.data_ptr() for t in sample.values(True, True)}
    assert overwritten_unsafely == [] and pin_copies == []


@pytest.mark.gpu_acceptance(PAGE_LOCKED_STAGED_REPLAY)
def test_with_prefetch_threads_no_staged_batch_is_overwritten_before_its_copy(fake_cuda):
    """prefetch=2: up to three gathers at once (two threads and the caller), three
    staging batches; every sample holds exactly the rows its index names."""
    cfg, _ = _pixel_buffer(batch_size=3, batch_length=5, prefetch=2)
    rb = _filled(make_replay_buffer(cfg.buffer, CUDA), trajs=6)
    stored = _storage_td(rb)
    assert len(rb.staging.slots) == 3
    for _ in range(30):
        sample = rb.sample()
        rows = sample["index"].squeeze(-1)
        assert torch.equal(sample["next", "pixels"], stored["next", "pixels"][rows])
        assert torch.equal(sample["action"], stored["action"][rows])
        _check_sequences(sample, 3, 5)


@pytest.mark.gpu_acceptance(PAGE_LOCKED_STAGED_REPLAY)
def test_a_staged_replay_checkpoints_its_prefetched_batches_without_events(fake_cuda, tmp_path):
    from dreamer.data.replay import load_replay_state, replay_state

    cfg, _ = _pixel_buffer(prefetch=2)
    rb = _filled(make_replay_buffer(cfg.buffer, CUDA))
    rb.sample()  # fills the prefetch queue
    path = tmp_path / "replay.pt"
    torch.save(replay_state(rb), path)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    restored = make_replay_buffer(cfg.buffer, CUDA)
    load_replay_state(restored, torch.load(path, weights_only=True))
    assert torch.equal(restored.sample()["action"], rb.sample()["action"])  # the same prefetched batch first



@pytest.mark.cuda(REPLAY_CUDA)
def test_page_locked_memory_is_pinned_for_cuda_and_copies_asynchronously():
    from torchrl_ext import page_locked_like

    step = TensorDict({"pixels": torch.zeros(64, 64, 3, dtype=torch.uint8), "reward": torch.zeros(1)}, [])
    storage = page_locked_like(step.expand(1000))
    assert all(t.is_pinned() for t in storage.values(True, True))
    storage["pixels"].copy_(torch.randint(0, 256, storage["pixels"].shape, dtype=torch.uint8))
    storage["reward"].normal_()
    on_gpu = storage.to(CUDA, non_blocking=True)
    torch.cuda.synchronize()
    assert (on_gpu.cpu() == storage).all()


@pytest.mark.cuda(REPLAY_CUDA)
def test_on_a_gpu_samples_match_upstream_and_sampling_never_syncs():
    """The real CUDA path: page-locked storage and staging, side-stream copies; the
    samples equal upstream's (moved to the GPU afterwards) and taking one makes no
    host sync (sync-debug mode "error" raises on one)."""
    cfg, reference = _pixel_buffer(batch_size=3, batch_length=5)
    cfg.buffer.pin_memory = "on"
    staged = make_replay_buffer(cfg.buffer, CUDA)
    _filled(reference), _filled(staged)
    assert all(t.is_pinned() for t in _storage_td(staged).values(True, True))
    for seed in range(4):
        torch.manual_seed(seed)
        want = reference.sample()
        torch.manual_seed(seed)
        if seed < len(staged.staging.slots):  # fresh staging batches: no copy to wait for on the host
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            got = staged.sample()
            doubled = got["next", "pixels"].float() * 2  # the learner's stream reads it: after the copy
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert got["next", "pixels"].is_cuda and got["action"].is_cuda
        assert (got.cpu() == want).all(), seed
        assert torch.equal(doubled.cpu(), want["next", "pixels"].float() * 2)
    assert all(t.is_pinned() for s in staged.staging.slots for t in s.batch.values(True, True))


def test_page_locked_memory_freed_after_the_fake_cuda_is_gone_never_waits_on_torch_cuda(monkeypatch):
    """Pages registered under the stand-in CUDA and freed later by the garbage collector,
    on a process whose CUDA runtime never started: their finalizer must not start one. The
    collector may run it inside torch.cuda's lazy-init lock (``torch.manual_seed`` holds it
    while queueing its CUDA seeding), where starting the runtime waited on itself forever."""
    import gc
    import threading

    from tests.support.fake_cuda import FakeCuda
    from torchrl_ext import host_memory

    if torch.cuda.is_initialized():
        pytest.skip("this process started CUDA: pages are unregistered for real")
    with monkeypatch.context() as patch:
        FakeCuda(patch)
        pages = host_memory.page_locked_empty(torch.empty(1024))
    finished = threading.Event()

    def free_inside_the_lock():
        nonlocal pages
        with torch.cuda._initialization_lock:
            del pages
            gc.collect()
        finished.set()

    threading.Thread(target=free_inside_the_lock, daemon=True).start()
    assert finished.wait(timeout=30), "the finalizer waited on torch.cuda's lazy-init lock"
