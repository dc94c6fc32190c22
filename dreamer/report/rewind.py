"""Cut a run directory's local records back to a checkpoint, by one key: ``updates``.

A resumed run restarts from its checkpoint; what the killed attempt logged
after it would otherwise be logged twice. Every record is one line of
``metrics.jsonl`` (``frames`` and ``updates`` always present) and one row
``step,value`` (step = env frames) in ``csv/scalars/<key>.csv`` for each of its
scalars (:func:`scalars`), in the same order. ``frames`` cannot be the cut: one
collector batch is followed by many updates, so records on both sides of a
checkpoint can share its frame count. The cut is ``updates``, for both:
metrics.jsonl keeps its lines up to the checkpoint's updates, and each CSV keeps
as many rows as the kept lines have values for its key. A line or row torn by a
kill is dropped. Files are replaced atomically.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

METRICS_NAME = "metrics.jsonl"
CSV_SCALARS = Path("csv") / "scalars"


def scalars(record: dict) -> dict:
    """The values of ``record`` that the logger backend gets (a CSV row each), frames being the step."""
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "frames"}


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _whole_rows(text: str) -> list[str]:
    """The ``step,value`` rows of a CSV; a row torn by a kill (or unreadable) is left out."""
    lines = text.split("\n")
    lines.pop()  # after the last newline: empty, or a row torn by a kill
    rows = []
    for line in lines:
        try:
            step, value = line.split(",")
            float(step), float(value)
        except ValueError:
            continue
        rows.append(line + "\n")
    return rows


def _cut_metrics(path: Path, updates: int) -> tuple[list[dict], int]:
    """(kept records, lines removed) of metrics.jsonl cut at ``updates``."""
    kept_lines, kept, lines = [], [], path.read_text().splitlines()
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("updates", 0) <= updates:
            kept_lines.append(line + "\n")
            kept.append(record)
    if len(kept_lines) != len(lines):
        _replace(path, "".join(kept_lines))
    return kept, len(lines) - len(kept_lines)


def rewind_records(run_dir: Path, updates: int) -> dict[str, int]:
    """Cut the records of ``run_dir`` back to a checkpoint at ``updates``; returns the
    rows removed per file (relative path -> count; files that lost none are left out).
    Without a metrics.jsonl (no record was ever logged) nothing is cut."""
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_NAME
    if not metrics.exists():
        return {}
    kept, dropped = _cut_metrics(metrics, updates)
    removed = {METRICS_NAME: dropped} if dropped else {}
    rows_per_key = Counter(key for record in kept for key in scalars(record))
    scalars_dir = run_dir / CSV_SCALARS
    for path in sorted(scalars_dir.rglob("*.csv")):
        key = path.relative_to(scalars_dir).with_suffix("").as_posix()
        text = path.read_text()
        rows = _whole_rows(text)[:rows_per_key[key]]
        cut = len(text.splitlines()) - len(rows)
        if cut:
            _replace(path, "".join(rows))
            removed[(CSV_SCALARS / path.relative_to(scalars_dir)).as_posix()] = cut
    return removed


def describe(removed: dict[str, int]) -> str:
    """``removed`` in a few words: metrics.jsonl first, then the CSVs grouped by rows removed."""
    def rows(count: int) -> str:
        return f"{count} row{'s' if count != 1 else ''}"

    parts = [f"{rows(removed[METRICS_NAME])} from {METRICS_NAME}"] if METRICS_NAME in removed else []
    by_count: dict[int, list[str]] = {}
    for name, count in removed.items():
        if name != METRICS_NAME:
            by_count.setdefault(count, []).append(name)
    for count, names in sorted(by_count.items(), reverse=True):
        parts.append(f"{rows(count)} from {names[0]}" if len(names) == 1 else
                     f"{rows(count)} from each of {', '.join(names)}")
    return "; ".join(parts)
