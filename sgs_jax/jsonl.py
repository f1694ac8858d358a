"""Append-only JSONL logs that survive a kill: torn tails are cut, rewrites are atomic.

A process killed (or out of disk) in the middle of an append leaves a last line without
its newline, possibly cut inside a multi-byte UTF-8 character. `repair_tail` cuts that
fragment off before the file is appended to again, so the next record starts on its own
line instead of being glued onto the fragment and lost. `read_records` decodes each line
on its own (bytes, then UTF-8, then JSON) and counts the lines it cannot read instead of
failing. `rewrite_records` replaces a file with a filtered copy through a temporary file
and `os.replace`, so a kill during the rewrite leaves either the old or the new file.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable


def repair_tail(path: str | os.PathLike) -> int:
    """Cut a torn last line (bytes after the last newline) off `path`; returns the number
    of bytes removed (0 when the file ends cleanly or does not exist)."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        # Scan back from the end in blocks for the last newline.
        end = size
        block = 1 << 16
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            chunk = f.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        else:
            keep = 0
        if keep < size:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return size - keep


def read_records(path: str | os.PathLike) -> tuple[list[dict[str, Any]], int]:
    """(records, unreadable line count) of a JSONL file; a missing file has none.

    Each line is decoded on its own: a line that is not UTF-8, not JSON or not an object
    is counted and skipped, never fatal. A last line without its newline is the torn
    write of a killed writer: it counts as unreadable even when it happens to parse
    (`repair_tail` agrees and cuts it).
    """
    records: list[dict[str, Any]] = []
    bad = 0
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return records, 0
    lines = data.split(b"\n")
    if lines[-1]:  # unterminated: torn
        bad += 1
    lines.pop()
    for raw in lines:
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            bad += 1
            continue
        if not isinstance(record, dict):
            bad += 1
            continue
        records.append(record)
    return records, bad


def dumps(record: dict[str, Any]) -> str:
    """One record as one line (newline included)."""
    return json.dumps(record, ensure_ascii=False) + "\n"


class Appender:
    """Appends whole lines to a JSONL file: a write the storage refuses part-way (disk
    full) is rolled back to the previous end of file before the OSError propagates, so
    the file never keeps half a record from a live process. Opening cuts a torn tail."""

    def __init__(self, path: str | os.PathLike, sync: bool = True):
        self.path = os.fspath(path)
        self.sync = sync
        repair_tail(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        """Write one record (fsync'd when `sync`)."""
        data = memoryview(dumps(record).encode("utf-8"))
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(self._fd, data):]
            if self.sync:
                os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, end)
            except OSError:
                pass  # the torn tail is cut when the file is next opened
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def rewrite_records(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    """Replace `path` atomically with `records`, one per line (fsync'd before the rename)."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"  # per process: several may write the same file
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(dumps(record))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def truncate_records(path: str | os.PathLike, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Keep only the readable records for which `keep(record)` is true (torn and unreadable
    lines go too); returns how many lines were dropped. The file is rewritten only when
    something is dropped."""
    records, bad = read_records(path)
    kept = [r for r in records if keep(r)]
    dropped = len(records) - len(kept) + bad
    if dropped:
        rewrite_records(path, kept)
    return dropped
