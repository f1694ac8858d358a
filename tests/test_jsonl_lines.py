"""The command-line tools' line accounting: strict line reading and in-order streaming output."""

import io
import json

import pytest

from sgs_jax.cli.jsonl_lines import InputLine, OrderedWriter, open_output, read_lines


def test_read_lines_gives_every_line_its_number_and_error(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n\n  \r\n[1\n"\xc3\x28"\n{"b": "\xc3\xa9"}\r\n7')
    lines = read_lines(path)
    assert [line.number for line in lines] == [1, 2, 3, 4, 5, 6, 7]
    assert lines[0] == InputLine(1, {"a": 1}) and lines[5] == InputLine(6, {"b": "é"}) and lines[6] == InputLine(7, 7)
    assert lines[1].error == "line 2 is blank" and lines[2].error == "line 3 is blank"
    assert lines[3].error.startswith("line 4 is not JSON")
    assert lines[4].error == "line 5 is not valid UTF-8 (byte 0xc3 at offset 1)"
    assert read_lines(tmp_path / "in.jsonl") == lines
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert read_lines(tmp_path / "empty.jsonl") == []


def test_ordered_writer_writes_the_done_prefix_at_once():
    stream = io.StringIO()
    writer = OrderedWriter(stream, 4)
    writer.put(2, {"x": 2})
    assert stream.getvalue() == ""  # waits for 0 and 1
    writer.put(0, {"x": 0})
    assert [json.loads(x) for x in stream.getvalue().splitlines()] == [{"x": 0}]
    writer.put(1, {"x": 1})
    writer.put(3, {"x": "é"})
    assert [json.loads(x)["x"] for x in stream.getvalue().splitlines()] == [0, 1, 2, "é"] and writer.complete
    for bad in (3, 4, -1):
        with pytest.raises(ValueError):
            writer.put(bad, {})


def test_open_output_refuses_the_input_file(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("x\n")
    with pytest.raises(OSError, match="is the input file"):
        open_output(inp, inp)
    assert inp.read_text() == "x\n"
    with open_output(tmp_path / "out.jsonl", inp) as f:
        f.write("ok\n")
