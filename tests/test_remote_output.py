"""The line writer every multi-threaded remote program shares (remote/output.py)."""

from __future__ import annotations

import io
import json
import threading

from orchestrator.remote.output import EVENT, Output


def test_lines_from_many_threads_are_never_spliced():
    stream = io.BytesIO()
    out = Output(stream)

    def write(n: int) -> None:
        for i in range(200):
            out.line(f"thread {n} line {i} ".encode() * 20)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    lines = stream.getvalue().split(b"\n")[:-1]
    assert len(lines) == 1600
    # Each line is one write repeated 20 times: another thread's bytes never land inside it.
    assert all(line == (b" ".join(line.split(b" ")[:4]) + b" ") * 20 for line in lines)


def test_events_take_a_dict_or_keywords_alike():
    stream = io.BytesIO()
    out = Output(stream)
    out.event("listening", {"port": 29500, "ok": True})
    out.event("exit", rc=1, reason=None)
    first, second = stream.getvalue().split(b"\n")[:2]
    assert first.startswith(EVENT) and json.loads(first[1:]) == {"ev": "listening", "port": 29500, "ok": True}
    assert json.loads(second[1:]) == {"ev": "exit", "rc": 1, "reason": None}


def test_a_closed_stream_is_let_go_quietly():
    stream = io.BytesIO()
    out = Output(stream)
    stream.close()
    out.line(b"nobody listens")
    out.event("hb")
