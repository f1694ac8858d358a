"""JSONL in and out for the command-line tools: one output record per input line.

The tools' line-accounting rule: every input line, blank, malformed and non-UTF-8 ones
included, gets exactly one output record, in input order, carrying its 1-based `line`
number. `read_lines` reads the input strictly (bad bytes are that line's error, never
silently replaced); `OrderedWriter` writes records as soon as they and every record
before them are done, flushing each, so a killed tool leaves a clean prefix behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, TextIO


@dataclasses.dataclass(frozen=True)
class InputLine:
    """One input line. number: 1-based. value: the parsed JSON (None on error).
    error: why the line cannot be used ("blank line", not UTF-8, not JSON), else None."""

    number: int
    value: Any = None
    error: str | None = None


def read_lines(path: str | os.PathLike) -> list[InputLine]:
    """Every line of a JSONL file, parsed or with its error (see `InputLine`)."""
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            lines.append(_parse(number, raw))
    return lines


def _parse(number: int, raw: bytes) -> InputLine:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return InputLine(number, error=f"line {number} is not valid UTF-8 (byte 0x{raw[err.start]:02x} at offset {err.start})")
    if not text.strip():
        return InputLine(number, error=f"line {number} is blank")
    try:
        return InputLine(number, json.loads(text))
    except json.JSONDecodeError as err:
        return InputLine(number, error=f"line {number} is not JSON: {err}")


def open_output(path: str | os.PathLike, input_path: str | os.PathLike) -> TextIO:
    """The output file, opened (created or truncated) for writing; OSError if it cannot be
    or if it is the input file (truncating it would lose the input). Tools call this
    before any work."""
    if os.path.exists(path) and os.path.exists(input_path) and os.path.samefile(path, input_path):
        raise OSError(f"the output {os.fspath(path)!r} is the input file")
    return open(path, "w", encoding="utf-8")


class OrderedWriter:
    """Writes one JSON record per input position, in input order, as records complete.

    put(position, record) may come in any order; each record is written (and flushed) as
    soon as every position before it has been written. Positions are 0-based.
    """

    def __init__(self, stream: TextIO, total: int):
        self.stream, self.total = stream, total
        self.written = 0
        self._pending: dict[int, dict[str, Any]] = {}

    def put(self, position: int, record: dict[str, Any]) -> None:
        if not 0 <= position < self.total or position < self.written or position in self._pending:
            raise ValueError(f"record position {position} is out of range or already given")
        self._pending[position] = record
        while self.written in self._pending:
            self.stream.write(json.dumps(self._pending.pop(self.written), ensure_ascii=False) + "\n")
            self.written += 1
        self.stream.flush()

    @property
    def complete(self) -> bool:
        return self.written == self.total
