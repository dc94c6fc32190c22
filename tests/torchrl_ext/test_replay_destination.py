"""torchrl_ext/replay.py StagedDeviceReplayBuffer.deliver_into (CUDA stood in for on the
CPU): samples are copied straight into one fixed device tensordict (a captured
update's static inputs), on the learner's stream, with no other device copy; a
staging batch is reused only after the copy out of it; prefetched host batches
give their staging slots back when the queue is dropped."""

from __future__ import annotations

import pytest
import torch

from dreamer.data.replay import load_replay_state, make_replay_buffer, replay_state, write
from tests.support.batches import collector_batch
from tests.support.configs import tiny_config

CUDA = torch.device("cuda")
pytestmark = pytest.mark.usefixtures("single_thread")


def staged_replay(prefetch: int = 0, trajs: int = 4):
    cfg = tiny_config(pixels=True)
    cfg.buffer.capacity, cfg.buffer.batch_size, cfg.buffer.batch_length, cfg.buffer.prefetch = 200, 3, 5, prefetch
    rb = make_replay_buffer(cfg.buffer, CUDA)
    for traj in range(trajs):
        write(rb, collector_batch(traj_id=traj, first_step=0, steps=20), "pixels")
    return rb


def assert_holds_its_rows(sample, rb) -> None:
    stored = rb.storage._storage
    rows = sample["index"].squeeze(-1)
    assert torch.equal(sample["next", "pixels"], stored["next", "pixels"][rows])
    assert torch.equal(sample["action"], stored["action"][rows])


@pytest.mark.parametrize("prefetch", [0, 2])
def test_samples_are_copied_into_the_destination_on_the_callers_stream_and_nothing_else(fake_cuda, prefetch):
    rb = staged_replay(prefetch=prefetch)
    destination = rb.sample().clone()  # the layout of a sample, on the learner's device
    addresses = {t.data_ptr() for t in destination.values(True, True)}
    rb.deliver_into(destination)
    for _ in range(max(1, prefetch)):  # sampled before deliver_into (those queued): copied in too
        assert rb.sample() is destination
    for _ in range(8):
        fake_cuda.log.clear()
        sample = rb.sample()
        assert sample is destination
        assert {t.data_ptr() for t in sample.values(True, True)} == addresses
        assert_holds_its_rows(sample, rb)
        assert fake_cuda.events("copy") == []  # no device batch of its own, no side-stream copy
        [(_, stream, event)] = fake_cuda.events("record")
        assert stream == "default"  # after the copy, on the caller's stream: frees its staging batch
    # A staging batch handed back waits for the copy out of it (prefetched ones are still held).
    assert all(slot.ready is not None or slot.batch is None for slot in list(rb.staging._free))

    rb.deliver_into(None)  # back to device batches of their own
    sample = rb.sample()
    assert sample is not destination
    assert_holds_its_rows(sample, rb)


def test_a_staging_batch_is_gathered_into_only_after_the_copy_out_of_it(fake_cuda, monkeypatch):
    rb = staged_replay(prefetch=0)
    destination = rb.sample().clone()
    rb.deliver_into(destination)
    unsafe = []
    index_select = torch.index_select

    def spy(source, dim, index, *, out=None):
        freed_by = next(
            (
                slot.ready
                for slot in rb.staging.slots
                if slot.batch is not None and any(t.data_ptr() == out.data_ptr() for t in slot.batch.values(True, True))
            ),
            None,
        )
        if freed_by is not None and not freed_by.synchronized:
            unsafe.append(out.shape)
        return index_select(source, dim, index, out=out)

    monkeypatch.setattr(torch, "index_select", spy)
    for _ in range(6):
        assert_holds_its_rows(rb.sample(), rb)
    assert unsafe == []


def test_prefetched_host_batches_checkpoint_and_give_their_slots_back(fake_cuda, tmp_path):
    rb = staged_replay(prefetch=2)
    destination = rb.sample().clone()
    rb.deliver_into(destination)
    rb.sample()
    rb.sample()  # the queue holds staged host batches now
    path = tmp_path / "replay.pt"
    torch.save(replay_state(rb), path)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    load_replay_state(rb, torch.load(path, weights_only=True))  # drops the queue it had
    free = len(rb.staging._free)
    assert free == len(rb.staging.slots), f"{len(rb.staging.slots) - free} staging slot(s) lost"
    for _ in range(4):  # the restored (cloned) prefetched batches, then fresh ones
        assert rb.sample() is destination
        assert_holds_its_rows(destination, rb)
