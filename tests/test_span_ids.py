"""Trace and span IDs: random, never zero, never shared between threads or a forked child.

They are cut from blocks of random bits (otelbpf/core/model.py), so these check what
that must not change: the sizes, uniqueness across block refills and threads,
the all-zero ID the specification forbids, and a child process after fork()
drawing IDs of its own rather than the rest of its parent's block."""

from __future__ import annotations

import os
import threading

import pytest

from otelbpf.core import model


def test_ids_have_their_sizes_and_do_not_repeat_across_refills():
    trace_ids = [model.new_trace_id() for _ in range(3000)]  # ~12 blocks of 256
    span_ids = [model.new_span_id() for _ in range(3000)]  # ~6 blocks of 512
    assert {len(i) for i in trace_ids} == {16}
    assert {len(i) for i in span_ids} == {8}
    assert len(set(trace_ids)) == len(trace_ids)
    assert len(set(span_ids)) == len(span_ids)


def test_threads_drawing_at_once_never_get_the_same_id():
    drawn: list[list[bytes]] = [[] for _ in range(4)]

    def draw(into: list[bytes]) -> None:
        for _ in range(5000):
            into.append(model.new_span_id())

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for into in drawn for i in into]
    assert len(set(every)) == len(every) == 20000


@pytest.mark.parametrize("new_id, size", [(model.new_trace_id, 16), (model.new_span_id, 8)])
def test_an_all_zero_draw_becomes_a_valid_id(monkeypatch, new_id, size):
    monkeypatch.setattr(model.random, "getrandbits", lambda bits: 0)
    model._empty_id_pools()
    try:
        assert new_id() == (1).to_bytes(size, "big")
    finally:
        model._empty_id_pools()


def test_a_forked_child_draws_its_own_ids():
    model.new_span_id()  # the parent holds the rest of a block
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report the IDs it draws, then leave at once
        os.close(read)
        os.write(write, b"".join(model.new_span_id() for _ in range(100)))
        os._exit(0)
    os.close(write)
    child = b""
    while chunk := os.read(read, 4096):
        child += chunk
    os.close(read)
    os.waitpid(pid, 0)
    parents = {model.new_span_id() for _ in range(100)}
    childs = {child[i : i + 8] for i in range(0, len(child), 8)}
    assert len(childs) == 100
    assert not parents & childs
