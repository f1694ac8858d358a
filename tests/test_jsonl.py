"""Append-only JSONL: torn tails cut (multi-byte characters too), unreadable lines counted,
rollback of a refused write, atomic filtered rewrite."""

import errno
import json
import os

import pytest

from sgs_jax import jsonl


def test_repair_tail_cuts_only_the_unterminated_fragment(tmp_path):
    path = tmp_path / "log.jsonl"
    whole = '{"a": 1}\n{"b": "ü"}\n'.encode()
    path.write_bytes(whole + '{"c": "∧'.encode()[:-1])  # cut inside a 3-byte character
    assert jsonl.repair_tail(path) == len('{"c": "∧'.encode()) - 1
    assert path.read_bytes() == whole
    assert jsonl.repair_tail(path) == 0
    assert jsonl.repair_tail(tmp_path / "missing.jsonl") == 0


def test_repair_tail_of_a_file_without_any_newline(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1')
    assert jsonl.repair_tail(path) == 7 and path.read_bytes() == b""


def test_read_records_counts_every_unreadable_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n\xff\xfe\n[1, 2]\nnot json\n\n{"b": 2}\n{"c": 3}')
    records, bad = jsonl.read_records(path)
    # bad UTF-8, not an object, not JSON, and the unterminated last line (torn, though it parses)
    assert records == [{"a": 1}, {"b": 2}] and bad == 4
    assert jsonl.read_records(tmp_path / "missing.jsonl") == ([], 0)


def test_truncate_records_keeps_what_it_is_told_and_drops_torn(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(5)) + '{"step": 5, "x', encoding="utf-8")
    assert jsonl.truncate_records(path, lambda r: r["step"] <= 2) == 3  # steps 3 and 4, and the torn line
    assert jsonl.read_records(path) == ([{"step": 0}, {"step": 1}, {"step": 2}], 0)
    before = os.stat(path).st_mtime_ns
    assert jsonl.truncate_records(path, lambda r: True) == 0
    assert os.stat(path).st_mtime_ns == before  # nothing dropped: not rewritten
    assert not list(tmp_path.glob("*.tmp"))


def test_appender_cuts_a_torn_tail_before_appending(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2, "sca')
    log = jsonl.Appender(path)
    log.append({"step": 2, "text": "p ∨ q"})
    log.close()
    assert jsonl.read_records(path) == ([{"step": 1}, {"step": 2, "text": "p ∨ q"}], 0)


def test_appender_rolls_back_a_refused_write(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    log = jsonl.Appender(path)
    log.append({"step": 1})
    real_write = os.write

    def half_then_full(fd, data):  # the disk fills in the middle of the record
        if len(data) > 4:
            return real_write(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        log.append({"step": 2, "long": "x" * 100})
    monkeypatch.setattr(os, "write", real_write)
    log.append({"step": 3})
    log.close()
    assert jsonl.read_records(path) == ([{"step": 1}, {"step": 3}], 0)
