"""A checkpoint file's integrity, checked before torch reads it: its declared sizes
bounded by its size on disk, and a sha256 of its bytes sealed into the file.

torch.save writes a zip whose last record (the end of central directory, EOCD)
ends with a 2-byte comment length, 0. :class:`DigestingWriter` hashes the bytes
as they are written, all but those last 2, in the same pass that writes them;
:meth:`DigestingWriter.seal` then sets the comment length and appends the
comment ``dreamer-sha256:<hex>``. Zip readers (torch's, Python's) accept a
comment. A reader hashes the file up to the comment length field in blocks
(never the whole file in memory; the pages it reads are the ones torch maps
next) and compares. A file without the comment was not written by
:func:`dreamer.run.checkpoint.save_checkpoint` and is refused as corrupt.

The size check reads the zip's central directory only (``zipfile``): a file
whose entries declare more bytes than the file holds (a deflated ``data.pkl``
that would unpack into gigabytes; torch accepts deflated entries, even with
``mmap=True``) is refused before anything is inflated.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zipfile
from pathlib import Path

DIGEST_PREFIX = b"dreamer-sha256:"
EOCD_SIGNATURE = b"PK\x05\x06"
EOCD_SIZE = 22  # without its comment
_BLOCK = 8 * 2**20


class CorruptFile(Exception):
    """The bytes on disk are not the bytes written (bit rot, truncation, an edited file)."""


class OversizedFile(Exception):
    """The zip declares more data than the file holds: loading it would inflate it."""


class DigestingWriter:
    """A file wrapper for torch.save: hashes what is written, in the same pass; keeps
    the OS error of a failed write (torch's zip writer reports a short write only as
    "unexpected pos", hiding ENOSPC / EFBIG / EDQUOT)."""

    def __init__(self, file):
        self.file = file
        self.error: OSError | None = None
        self._sha = hashlib.sha256()
        self._held = b""  # the last 2 bytes seen: the comment length, left out of the digest
        self._tail = b""  # the last EOCD_SIZE bytes seen

    def write(self, data) -> int:
        try:
            written = self.file.write(data)
        except OSError as err:
            self.error = err
            raise
        view = memoryview(data).cast("B")
        if len(view) >= 2:
            self._sha.update(self._held)
            self._sha.update(view[:-2])
            self._held = bytes(view[-2:])
        else:
            joined = self._held + bytes(view)
            self._sha.update(joined[:-2])
            self._held = joined[-2:]
        self._tail = (self._tail + bytes(view[-EOCD_SIZE:]))[-EOCD_SIZE:]
        return written

    def flush(self) -> None:
        self.file.flush()

    def seal(self) -> str:
        """Append the digest as the zip's comment; returns it (hex)."""
        if self._tail[:4] != EOCD_SIGNATURE or self._held != b"\0\0":
            raise ValueError("torch.save did not end the file with an empty zip comment")
        digest = self._sha.hexdigest()
        comment = DIGEST_PREFIX + digest.encode()
        try:
            self.file.seek(-2, os.SEEK_END)
            self.file.write(struct.pack("<H", len(comment)) + comment)
        except OSError as err:
            self.error = err
            raise
        return digest


def check(path: Path) -> str:
    """Check ``path`` before loading it: raises :class:`OversizedFile` when its entries
    declare more bytes than the file holds, :class:`CorruptFile` when it is not a
    readable zip, carries no sealed digest, or its digest does not match. Returns the
    digest."""
    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as archive:
            declared = sum(info.file_size for info in archive.infolist())
            compressed = [info.filename for info in archive.infolist() if info.compress_type != zipfile.ZIP_STORED]
            comment = archive.comment
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as err:
        raise CorruptFile(f"not a readable zip: {err}") from None
    if declared > size:
        detail = f" (compressed: {', '.join(compressed[:3])})" if compressed else ""
        raise OversizedFile(f"declares {declared / 2**20:.1f} MiB of data in a {size / 2**10:.0f} KiB file{detail}")
    if not comment.startswith(DIGEST_PREFIX):
        raise CorruptFile("no sealed digest: not a checkpoint dreamer wrote")
    expected = comment[len(DIGEST_PREFIX):].decode(errors="replace")
    actual = file_digest(path, size - len(comment) - 2)
    if actual != expected:
        raise CorruptFile("its content does not match the sha256 written with it (bit rot or a modified file)")
    return actual


def file_digest(path: Path, length: int) -> str:
    """sha256 of the first ``length`` bytes of ``path``, read in blocks."""
    sha = hashlib.sha256()
    block = bytearray(_BLOCK)
    view = memoryview(block)
    with open(path, "rb", buffering=0) as f:
        while length > 0:
            n = f.readinto(view[:min(_BLOCK, length)])
            if not n:
                raise CorruptFile("shorter than its sealed digest says")
            sha.update(view[:n])
            length -= n
    return sha.hexdigest()
