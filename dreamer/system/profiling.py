"""Profiling: trace a window of learner updates, in the learner and in every
collector worker, and merge the traces into one Chrome/Perfetto JSON.

The learner owns the window (``profiling.first_update``..``last_update``). It
raises a shared flag while it traces; each worker's collector hook watches
that flag and traces its own rollouts meanwhile, so all processes cover the
same stretch of wall-clock time. Every process writes its own trace file;
after the collectors shut down, :func:`merge_traces` writes
``merged_trace.json`` with one process row per source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from dreamer.config import ProfilingConfig

log = logging.getLogger("dreamer")

MERGED_TRACE = "merged_trace.json"
LEARNER_TRACE = "learner_trace.json"
WORKER_TRACE = "collector_{pid}_trace.json"
COLLECT_RANGE = "## collect/step ##"


def _new_profiler(mode: str) -> profile:
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    full = mode == "full"
    return profile(activities=activities, record_shapes=full, profile_memory=full, with_stack=full)


class CollectorTracer:
    """Collector ``post_collect_hook`` run inside a worker: traces the worker's
    rollouts from the first one that ends after the learner opened its window
    to the first one that ends after it closed it (at least one rollout, even
    when the learner's window is shorter than a rollout), then writes its trace.

    Each rollout sits in a ``## collect/step ##`` range, opened after one
    rollout and closed after the next: TorchRL pickles its pre- and
    post-collect hooks separately, so they could not share an open range. The
    range therefore also covers the worker's wait for the next request.
    """

    def __init__(self, window_opened, window_closed, output_dir: str, mode: str):
        # multiprocessing Events shared with the learner; set once each, never cleared.
        self.window_opened = window_opened
        self.window_closed = window_closed
        self.output_dir = output_dir
        self.mode = mode
        self._profiler: profile | None = None
        self._range: record_function | None = None
        self._done = False

    def __call__(self, batch=None) -> None:
        if self._done:
            return
        self._close_range()
        if self._profiler is None:
            if not self.window_opened.is_set():
                return
            self._profiler = _new_profiler(self.mode)
            self._profiler.start()
        elif self.window_closed.is_set():
            self.stop()
            return
        self._range = record_function(COLLECT_RANGE)
        self._range.__enter__()

    def _close_range(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def stop(self) -> None:
        """End the trace and write it."""
        self._close_range()
        if self._profiler is not None and not self._done:
            self._profiler.stop()
            path = Path(self.output_dir) / WORKER_TRACE.format(pid=os.getpid())
            path.parent.mkdir(parents=True, exist_ok=True)
            self._profiler.export_chrome_trace(str(path))
        self._done = True


class TraceWindow:
    """The learner side: ``with window.update(n):`` around update number ``n``
    (counted from 1) traces updates ``first_update``..``last_update``."""

    def __init__(self, cfg: ProfilingConfig, active: bool = True):
        # active=False: a data-parallel rank other than 0 (rank 0 traces the window).
        self.cfg = dataclasses.replace(cfg, enabled=cfg.enabled and active)
        self.output_dir = Path(self.cfg.output_dir)
        self._profiler: profile | None = None
        self._finished = False
        if self.cfg.enabled:
            import torch.multiprocessing as mp

            ctx = mp.get_context("spawn")
            self._window_opened, self._window_closed = ctx.Event(), ctx.Event()
            self.output_dir.mkdir(parents=True, exist_ok=True)
            # Traces of an earlier run in the same directory must not be merged in.
            stale = [*self.output_dir.glob(WORKER_TRACE.format(pid="*")), self.output_dir / LEARNER_TRACE]
            for old in stale:
                old.unlink(missing_ok=True)

    def collector_hook(self) -> CollectorTracer | None:
        """The hook each collector worker runs after a rollout (None when off)."""
        if not self.cfg.enabled:
            return None
        return CollectorTracer(self._window_opened, self._window_closed, str(self.output_dir), self.cfg.mode)

    @contextlib.contextmanager
    def update(self, number: int):
        if not self.cfg.enabled or self._finished:
            yield
            return
        if number == self.cfg.first_update:
            log.info("profiling updates %d-%d (%s)", self.cfg.first_update, self.cfg.last_update, self.cfg.mode)
            self._profiler = _new_profiler(self.cfg.mode)
            self._profiler.start()
            self._window_opened.set()
        yield
        if number == self.cfg.last_update and self._profiler is not None:
            self._stop()

    def _stop(self) -> None:
        self._window_closed.set()
        self._profiler.stop()
        self._profiler.export_chrome_trace(str(self.output_dir / LEARNER_TRACE))
        self._profiler = None
        self._finished = True

    def finish(self) -> Path | None:
        """After the collectors shut down (their traces are written): merge.
        A run that ends inside the window is traced up to its end."""
        if not self.cfg.enabled:
            return None
        if self._profiler is not None:
            self._stop()
        learner = self.output_dir / LEARNER_TRACE
        if not learner.exists():
            log.warning("profiling: the run ended before update %d; no trace written", self.cfg.first_update)
            return None
        sources = [("learner", learner)] + [
            (f"collector worker {p.name.split('_')[1]}", p)
            for p in sorted(self.output_dir.glob(WORKER_TRACE.format(pid="*")))
        ]
        try:
            merged = merge_traces(sources, self.output_dir / MERGED_TRACE)
        except (OSError, ValueError) as err:  # e.g. a worker killed while writing its trace
            # Called on the way out of the train loop: never hide the run's own outcome.
            log.warning("profiling: could not merge the traces in %s (%s)", self.output_dir, err)
            return None
        log.info("profiling: merged %d traces into %s", len(sources), merged)
        return merged


def merge_traces(sources: list[tuple[str, Path]], out: Path) -> Path:
    """Merge Chrome traces into one: one process row per source (named by its
    label), timestamps put on a common base, so Perfetto shows them aligned."""
    traces = [(label, json.loads(Path(path).read_text())) for label, path in sources]
    bases = [t.get("baseTimeNanoseconds", 0) for _, t in traces]
    base = min(bases)
    events = []
    for index, ((label, trace), own_base) in enumerate(zip(traces, bases)):
        shift_us = (own_base - base) / 1000
        # Rows are keyed by pid: give each source its own block so a GPU row
        # (pid = device index) or a reused pid can never fold two sources together.
        new_pids: dict = {}
        for event in trace.get("traceEvents", []):
            pid = event.get("pid")
            if pid not in new_pids:
                new_pids[pid] = (index + 1) * 1000 + len(new_pids)
            event = dict(event, pid=new_pids[pid])
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] = event["ts"] + shift_us
            if event.get("ph") == "M" and event.get("name") == "process_name":
                original = event.get("args", {}).get("name", "")
                # The first row of a torch trace is its CPU process: the source itself.
                name = label if new_pids[pid] == (index + 1) * 1000 else f"{label} ({original})"
                event["args"] = {"name": name}
            if event.get("ph") == "M" and event.get("name") == "process_sort_index":
                event["args"] = {"sort_index": new_pids[pid]}
            events.append(event)
    merged = {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base, "traceEvents": events}
    out.write_text(json.dumps(merged))
    return out
