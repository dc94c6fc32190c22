"""Replay of per-env streams: sequences that start at any stored step and run
across episode ends, as DreamerV3's reference replays them.

Each env (a collector worker) writes one *stream* of steps; episodes follow
each other inside it, their first steps flagged. A multi-process collector
delivers the streams' batches in any order, so in a ring storage a stream's
steps lie in chunks between other streams' chunks.

:class:`StreamStepWriter` numbers each stream's steps as they are written (a
counter per stream, kept in its state dict) and writes through storage slices
(:class:`~torchrl_ext.replay.SliceCursorWriter`).

:class:`StreamSliceSampler` draws ``num_slices`` windows of ``slice_len``
consecutive steps of one stream, every window start equally likely: a stored
step is in as many windows as any other, except within ``slice_len - 1`` steps of
the edges of its stream's live data. A window never joins two streams, never
joins the newest steps to the oldest across the ring's write cursor, and never
bridges a gap in a stream's step numbers. It keeps an index of where each
stream's chunks lie (a few entries per written batch, updated from the indices
each write reports and the written rows' stream and step columns), so a sample
costs ``O(batch)`` plus a search over the chunks, never a pass over the storage.

Why not upstream's pieces: ``SliceSampler(fragmented=True)`` reconstructs
interleaved trajectories from the same two columns, but rebuilds a per-record
Python index and draws runs (streams) uniformly rather than steps, so a longer
stream's steps are drawn less often; a ``ReplayBufferEnsemble`` of one buffer
per env gathers each member separately and splits the capacity evenly between
envs fixed at build.
"""

from __future__ import annotations

import bisect
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage

from torchrl_ext.replay import SliceCursorWriter

# stream << STREAM_SHIFT | step orders chunks by stream, then by step.
STREAM_SHIFT = 40


class StreamStepWriter(SliceCursorWriter):
    """A :class:`~torchrl_ext.replay.SliceCursorWriter` that numbers every written
    step within its stream: ``step_key`` gets ``0, 1, 2, ...`` per value of
    ``stream_key`` over the buffer's lifetime (a restarted env continues its
    stream's numbering; its first step is flagged by the caller, not here)."""

    def __init__(self, *, stream_key: NestedKey, step_key: NestedKey, **kwargs):
        super().__init__(**kwargs)
        self.stream_key = stream_key
        self.step_key = step_key
        self._next_step: dict[int, int] = {}

    def extend(self, data) -> torch.Tensor:
        if isinstance(data, TensorDictBase):
            streams = data.get(self.stream_key).reshape(-1).long()
            steps = torch.empty_like(streams)
            for stream in streams.unique().tolist():
                rows = streams == stream
                first = self._next_step.get(stream, 0)
                count = int(rows.sum())
                steps[rows] = torch.arange(first, first + count)
                self._next_step[stream] = first + count
            data.set(self.step_key, steps.reshape(data.get(self.stream_key).shape))
        return super().extend(data)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "next_step": [[s, self._next_step[s]] for s in sorted(self._next_step)]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        pairs = state_dict.pop("next_step", None)
        super().load_state_dict(state_dict)
        self._next_step = {} if pairs is None else {int(s): int(n) for s, n in pairs}

    def _empty(self, empty_write_count: bool = True) -> None:
        super()._empty(empty_write_count=empty_write_count)
        self._next_step = {}


class _Chunks:
    """Where each stream's steps lie: disjoint runs of storage rows ``[row, row + length)``
    holding steps ``[step, step + length)`` of one stream, keyed by their first row."""

    def __init__(self):
        self.rows: list[int] = []  # first rows, sorted
        self.runs: dict[int, tuple[int, int, int]] = {}  # first row -> (stream, first step, length)

    def __len__(self) -> int:
        return sum(length for _, _, length in self.runs.values())

    def clear(self) -> None:
        self.rows.clear()
        self.runs.clear()

    def remove(self, start: int, stop: int) -> None:
        """Forget rows [start, stop) (overwritten), splitting the runs they cut."""
        i = bisect.bisect_left(self.rows, stop)
        while i > 0:
            i -= 1
            row = self.rows[i]
            stream, step, length = self.runs[row]
            end = row + length
            if end <= start:
                break
            del self.rows[i]
            del self.runs[row]
            if row < start:  # the part before the overwritten rows stays
                self._insert(row, stream, step, start - row)
            if end > stop:  # and the part after them
                self._insert(stop, stream, step + stop - row, end - stop)

    def add(self, row: int, stream: int, step: int, length: int) -> None:
        self._insert(row, stream, step, length)

    def _insert(self, row: int, stream: int, step: int, length: int) -> None:
        bisect.insort(self.rows, row)
        self.runs[row] = (stream, step, length)

    def table(self) -> torch.Tensor:
        """(chunks, 4) long: stream, first step, first row, length; sorted by stream, then step."""
        if not self.runs:
            return torch.zeros(0, 4, dtype=torch.long)
        table = torch.tensor([(s, st, row, n) for row, (s, st, n) in self.runs.items()], dtype=torch.long)
        order = torch.argsort((table[:, 0] << STREAM_SHIFT) | table[:, 1])
        return table[order]


def _row_ranges(index: torch.Tensor) -> list[tuple[int, int]]:
    """Consecutive runs of ``index`` (in its order) as [start, stop) row ranges."""
    if index.numel() == 0:
        return []
    breaks = (torch.nonzero(index.diff() != 1).reshape(-1) + 1).tolist()
    bounds = [0, *breaks, index.numel()]
    values = index.tolist()
    return [(values[a], values[b - 1] + 1) for a, b in zip(bounds[:-1], bounds[1:])]


class StreamSliceSampler(Sampler):
    """Windows of ``slice_len`` consecutive steps of one stream, any start equally
    likely (see the module docstring). ``batch_size`` must be a multiple of ``slice_len``.

    ``stream_key`` / ``step_key``: the storage's per-step stream id and step number
    (:class:`StreamStepWriter` writes the latter). The sampler returns the storage
    rows only: it flags nothing (no truncation at window ends, no first-step marker);
    episode starts are whatever the data flags.

    Its index of chunks is derived data: it is not saved with the state dict and is
    rebuilt from the storage's two columns after a load.
    """

    def __init__(self, *, slice_len: int, stream_key: NestedKey, step_key: NestedKey):
        if slice_len < 1:
            raise ValueError(f"slice_len must be positive, got {slice_len}")
        self.slice_len = slice_len
        self.stream_key = stream_key
        self.step_key = step_key
        self._chunks = _Chunks()
        self._pending: list[torch.Tensor] = []  # written indices not yet in the index
        self._stale = False  # True after a load: rebuild the index from the storage
        # (chunk table, segment table) as of the last write; None once a write came in.
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- writes ---------------------------------------------------------------
    def extend(self, index: torch.Tensor) -> None:
        self._pending.append(torch.as_tensor(index).reshape(-1).long().clone())
        self._table = None

    def add(self, index: int) -> None:
        self.extend(torch.tensor([index]))

    def _refresh(self, storage: Storage) -> None:
        if self._stale:
            self._rebuild(storage)
        for index in self._pending:
            self._index_rows(storage, index)
        self._pending.clear()

    def _columns(self, storage: Storage, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        data = storage._storage
        streams = data.get(self.stream_key)[index].reshape(-1).long()
        steps = data.get(self.step_key)[index].reshape(-1).long()
        return streams, steps

    def _index_rows(self, storage: Storage, index: torch.Tensor) -> None:
        """Rows ``index`` were just written: forget what they held, index what they hold."""
        for start, stop in _row_ranges(index):
            self._chunks.remove(start, stop)
        streams, steps = self._columns(storage, index)
        self._add_runs(index, streams, steps)

    def _add_runs(self, rows: torch.Tensor, streams: torch.Tensor, steps: torch.Tensor) -> None:
        """Index rows whose runs of consecutive rows, one stream and consecutive steps are chunks."""
        if rows.numel() == 0:
            return
        breaks = (rows.diff() != 1) | (streams.diff() != 0) | (steps.diff() != 1)
        starts = [0, *(torch.nonzero(breaks).reshape(-1) + 1).tolist()]
        stops = [*starts[1:], rows.numel()]
        for a, b in zip(starts, stops):
            self._chunks.add(int(rows[a]), int(streams[a]), int(steps[a]), b - a)

    def _rebuild(self, storage: Storage) -> None:
        """The index from the storage's stream and step columns (after a load)."""
        self._chunks.clear()
        self._pending.clear()
        self._stale = False
        filled = len(storage)
        if filled == 0 or getattr(storage, "_storage", None) is None:
            return
        rows = torch.arange(filled)
        streams, steps = self._columns(storage, rows)
        order = torch.argsort((streams << STREAM_SHIFT) | steps)
        self._add_runs(rows[order], streams[order], steps[order])

    # -- the windows ------------------------------------------------------------
    def _windows(self, storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk table (``_Chunks.table``) and the segment table, (segments, 4) long:
        the segment's first row in the chunk table, its first step, its stream, its
        window starts. A segment is a stream's run of consecutive steps."""
        self._refresh(storage)
        if self._table is not None:
            return self._table
        chunks = self._chunks.table()
        if chunks.shape[0] == 0:
            self._table = (chunks, torch.zeros(0, 4, dtype=torch.long))
            return self._table
        stream, step, _, length = chunks.unbind(-1)
        # A new segment where the stream changes or its steps jump.
        new = torch.ones_like(stream, dtype=torch.bool)
        new[1:] = (stream[1:] != stream[:-1]) | (step[1:] != step[:-1] + length[:-1])
        first = torch.nonzero(new).reshape(-1)
        segment_of = torch.cumsum(new.long(), 0) - 1
        total = torch.zeros(first.numel(), dtype=torch.long).index_add_(0, segment_of, length)
        windows = (total - self.slice_len + 1).clamp_min(0)
        segments = torch.stack([first, step[first], stream[first], windows], -1)
        self._table = (chunks, segments)
        self._keys = (chunks[:, 0] << STREAM_SHIFT) | chunks[:, 1]  # the chunks' search keys
        return self._table

    def _sampleable_count(self, storage: Storage, batch_size: int) -> int:
        if len(storage) == 0:
            return 0
        _, segments = self._windows(storage)
        return int(segments[:, 3].sum())

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        if batch_size % self.slice_len:
            raise ValueError(f"batch_size={batch_size} is not a multiple of slice_len={self.slice_len}")
        num_slices = batch_size // self.slice_len
        chunks, segments = self._windows(storage)
        windows = segments[:, 3]
        total = int(windows.sum()) if windows.numel() else 0
        if total == 0:
            longest = self._longest(chunks, segments)
            raise RuntimeError(
                f"no stream holds {self.slice_len} consecutive steps yet (the longest holds {longest})"
            )
        draw = torch.randint(total, (num_slices,), generator=self._rng)
        ends = torch.cumsum(windows, 0)
        segment = torch.searchsorted(ends, draw, right=True)
        offset = draw - (ends - windows)[segment]
        steps = (segments[segment, 1] + offset).unsqueeze(-1) + torch.arange(self.slice_len)  # (slices, T)
        streams = segments[segment, 2].unsqueeze(-1).expand_as(steps)
        chunk = torch.searchsorted(self._keys, (streams << STREAM_SHIFT) | steps, right=True) - 1
        rows = chunks[chunk, 2] + (steps - chunks[chunk, 1])
        return rows.reshape(-1), {}

    @staticmethod
    def _longest(chunks: torch.Tensor, segments: torch.Tensor) -> int:
        if segments.shape[0] == 0:
            return 0
        new = torch.zeros(chunks.shape[0], dtype=torch.long)
        new[segments[:, 0]] = 1
        totals = torch.zeros(segments.shape[0], dtype=torch.long).index_add_(
            0, torch.cumsum(new, 0) - 1, chunks[:, 3]
        )
        return int(totals.max())

    # -- state ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"slice_len": self.slice_len}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._stale = True  # the index follows the loaded storage
        self._table = None

    def _empty(self) -> None:
        self._chunks.clear()
        self._pending.clear()
        self._stale = False
        self._table = None

    def dumps(self, path) -> None:
        pass  # derived from the storage

    def loads(self, path) -> None:
        self.load_state_dict({})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(slice_len={self.slice_len}, stream_key={self.stream_key!r})"
