"""sglang_patch.tracefile: a trace on a full filesystem stops itself instead of raising into a hook."""

from __future__ import annotations

import logging

from sglang_patch.tracefile import TraceFile


def test_a_full_disk_stops_the_trace_once_and_never_raises(caplog):
    t = TraceFile("/dev/full")  # the kernel's full device: every write that reaches it fails with ENOSPC
    with caplog.at_level(logging.WARNING, logger="ebctl"):
        t.write('{"it":1}\n')  # line-buffered: the newline flushes, the flush fails
        t.write('{"it":2}\n')
    assert "No space left on device" in t.stopped and t.f is None
    assert [r.getMessage().count("stopped") for r in caplog.records] == [1]
    t.close()


def test_a_writable_trace_keeps_every_line(tmp_path):
    path = tmp_path / "trace.jsonl"
    t = TraceFile(str(path))
    t.write('{"it":1}\n')
    t.write('{"it":2}\n')
    assert path.read_text() == '{"it":1}\n{"it":2}\n' and t.stopped == ""  # line-buffered: on disk already
    t.close()
    t.write('{"it":3}\n')  # after close: nothing, no error
    assert path.read_text().count("\n") == 2
