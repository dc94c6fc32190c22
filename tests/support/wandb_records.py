"""Read W&B offline run folders as `wandb sync` would see them (no account, no network).

wandb 0.31 reads its .wandb record log only in its Go core; the format is a
LevelDB-style log (32 KiB blocks, records of crc32 (4) + length (2) + type (1)
chunks; 1 full, 2 first, 3 middle, 4 last) after a 7-byte ``:W&B`` header, each
record one ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32768
HEADER = 7


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", data[:HEADER]
    pos, out, chunks = HEADER, [], b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += left
            continue
        if pos + HEADER + length > len(data):  # still being written
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        chunks = chunk if kind in (1, 2) else chunks + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            out.append(record)
            chunks = b""
    return out


def offline_runs(run_dir: Path) -> list[Path]:
    """The offline run folders of a run directory, oldest first."""
    return sorted((Path(run_dir) / "wandb").glob("offline-run-*"))


def finished_records(folder: Path, timeout: float = 30.0) -> list:
    """The records of a folder's .wandb file once its run's exit record is in it
    (wandb-core writes the file on its own schedule, also after ``finish()`` returned)."""
    (log,) = folder.glob("*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        out = records(log)
        if out and out[-1].WhichOneof("record_type") == "exit" or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def run_ids(folder: Path) -> set[str]:
    """The run ids a folder's .wandb file names (its run records)."""
    return {r.run.run_id for r in finished_records(folder) if r.WhichOneof("record_type") == "run"}


def history(folder: Path) -> list[dict]:
    """The folder's history rows, each {key: value} (keys "a/b" for nested ones)."""
    rows = []
    for r in finished_records(folder):
        if r.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return rows
