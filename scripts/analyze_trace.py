"""Summarise a Chrome/Perfetto trace from torch.profiler (or our merged_trace.json).

    python scripts/analyze_trace.py traces/merged_trace.json
    python scripts/analyze_trace.py after.json --compare before.json

Prints: time per named range (``## train/sample ##`` and friends: total and
mean ms, calls), Memcpy HtoD / DtoH totals, the top ops by self time, and how
many kernels came from torch.compile (Triton, Inductor C++) against eager
aten ops. With ``--compare`` a before/after table of ranges and copies.

The file is streamed event by event (traces reach gigabytes); only a few
numbers per event are kept. ``.json.gz`` works too.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

NAMED_RANGE = re.compile(r"^## .+ ##$")
CHUNK = 1 << 20


def iter_events(path: Path):
    """Yield the objects of the top-level ``traceEvents`` array without loading the file."""
    opener = gzip.open if str(path).endswith(".gz") else open
    decoder = json.JSONDecoder()
    with opener(path, "rt", encoding="utf-8") as f:
        buf = ""
        while '"traceEvents"' not in buf:
            chunk = f.read(CHUNK)
            if not chunk:
                raise ValueError(f"{path}: no traceEvents array; is this a Chrome trace?")
            buf += chunk
        buf = buf[buf.index('"traceEvents"') + len('"traceEvents"'):]
        pos = None
        while pos is None:
            start = buf.find("[")
            if start >= 0:
                pos = start + 1
            else:
                more = f.read(CHUNK)
                if not more:
                    raise ValueError(f"{path}: traceEvents is not an array")
                buf += more
        eof = False
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                event, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    raise ValueError(f"{path}: truncated trace") from None
                more = f.read(CHUNK)
                eof = not more
                buf = buf[pos:] + more
                pos = 0
                continue
            yield event
            pos = end
            if pos > CHUNK:  # drop what has been parsed
                buf, pos = buf[pos:], 0


@dataclass
class Stat:
    total_us: float = 0.0
    calls: int = 0

    def add(self, dur: float) -> None:
        self.total_us += dur
        self.calls += 1


@dataclass
class Summary:
    ranges: dict = field(default_factory=lambda: defaultdict(Stat))
    memcpy: dict = field(default_factory=lambda: defaultdict(Stat))
    self_time: dict = field(default_factory=lambda: defaultdict(Stat))
    kernels: dict = field(default_factory=lambda: defaultdict(int))
    processes: dict = field(default_factory=dict)


def kernel_kind(name: str, cat: str) -> str | None:
    """Which engine produced an event: compiled (Triton, Inductor C++), or eager aten."""
    if name.startswith("triton_") or "triton" in cat.lower():
        return "triton kernels (compiled)"
    if name.startswith("cpp_fused") or "cpp_fused" in name:
        return "inductor C++ kernels (compiled)"
    if name.startswith("## Call CompiledFxGraph"):
        return "compiled graph calls"
    if name in ("Torch-Compiled Region", "CompiledFunction") or name.startswith("Torch-Compiled Region"):
        return "compiled regions entered"
    if cat == "cpu_op" and name.startswith("aten::"):
        return "eager aten ops"
    return None


def summarize(path: Path) -> Summary:
    s = Summary()
    ops_by_thread: dict = defaultdict(list)  # (pid, tid) -> [(ts, dur, name)]
    for e in iter_events(path):
        ph, name = e.get("ph"), e.get("name", "")
        if ph == "M" and name == "process_name":
            s.processes[e.get("pid")] = e.get("args", {}).get("name", "")
            continue
        if ph != "X":
            continue
        cat, dur = e.get("cat", ""), float(e.get("dur", 0.0))
        kind = kernel_kind(name, cat)
        if kind:
            s.kernels[kind] += 1
        if NAMED_RANGE.match(name) and kind is None and cat in ("user_annotation", "gpu_user_annotation", ""):
            # The GPU copy of a CPU range would count it twice.
            if cat != "gpu_user_annotation":
                s.ranges[name].add(dur)
            continue
        if name.startswith("Memcpy HtoD") or name.startswith("Memcpy DtoH"):
            s.memcpy[name[:11]].add(dur)
        if cat in ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset"):
            ops_by_thread[(e.get("pid"), e.get("tid"))].append((float(e["ts"]), dur, name))
    for ops in ops_by_thread.values():
        _add_self_times(ops, s.self_time)
    return s


def _add_self_times(ops: list, out: dict) -> None:
    """Self time = duration minus direct children's (ops nest per thread)."""
    ops.sort(key=lambda op: (op[0], -op[1]))
    stack: list = []  # [end, name, child_us, dur]
    def pop():
        end, name, child, dur = stack.pop()
        out[name].add(max(dur - child, 0.0))
    for ts, dur, name in ops:
        while stack and stack[-1][0] <= ts:
            pop()
        if stack:
            stack[-1][2] += dur
        stack.append([ts + dur, name, 0.0, dur])
    while stack:
        pop()


def _ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)] if rows else [len(h) for h in headers]

    def line(cells) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def report(s: Summary, top: int = 20) -> str:
    parts = []
    if s.processes:
        parts.append("processes: " + ", ".join(sorted(set(s.processes.values()))))
    rows = [[n, _ms(st.total_us), _ms(st.total_us / st.calls), st.calls] for n, st in sorted(s.ranges.items())]
    parts.append("Named ranges\n" + (_table(["range", "total ms", "mean ms", "calls"], rows) if rows else "(none)"))
    rows = [[k, _ms(st.total_us), st.calls] for k, st in sorted(s.memcpy.items())]
    copies = _table(["copy", "total ms", "count"], rows) if rows else "Memcpy HtoD / DtoH: none (CPU-only trace)"
    parts.append("Copies\n" + copies)
    ranked = sorted(s.self_time.items(), key=lambda kv: kv[1].total_us, reverse=True)[:top]
    rows = [[n[:70], _ms(st.total_us), st.calls] for n, st in ranked]
    parts.append(f"Top {top} ops by self time\n" + _table(["op", "self ms", "calls"], rows))
    kinds = ["triton kernels (compiled)", "inductor C++ kernels (compiled)", "compiled graph calls",
             "compiled regions entered", "eager aten ops"]
    parts.append("Kernels (on CPU, Inductor's C++ kernels run inside compiled graph calls unlisted)\n"
                 + _table(["kind", "count"], [[k, s.kernels.get(k, 0)] for k in kinds]))
    return "\n\n".join(parts)


def compare(before: Summary, after: Summary) -> str:
    rows = []
    for label, b_map, a_map in (("", before.ranges, after.ranges), ("", before.memcpy, after.memcpy)):
        for name in sorted(set(b_map) | set(a_map)):
            b, a = b_map.get(name, Stat()), a_map.get(name, Stat())
            change = f"{(a.total_us - b.total_us) / b.total_us * 100:+.1f}%" if b.total_us else "new"
            rows.append([name, _ms(b.total_us), _ms(a.total_us), change])
    return "Before -> after (total ms)\n" + _table(["range / copy", "before", "after", "change"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, help="Chrome trace JSON (merged_trace.json or a torch.profiler export)")
    parser.add_argument("--compare", type=Path, metavar="OTHER",
                        help="an earlier trace: print a before (OTHER) / after (TRACE) table")
    parser.add_argument("--top", type=int, default=20, help="ops listed by self time (default 20)")
    args = parser.parse_args(argv)
    try:
        after = summarize(args.trace)
        print(report(after, args.top))
        if args.compare:
            print()
            print(compare(summarize(args.compare), after))
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
