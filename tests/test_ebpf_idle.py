"""Sleeping while idle, through the real probes and ring buffer.

An agent that has caught up sleeps on the ring (EbpfSource.wait_for_records):
the probes then submit with the kernel's adaptive wake-up, so the first record
wakes it. The rest of the time they submit without one (BPF_RB_NO_WAKEUP): a
wake-up per record is what cut nginx to 0.57x (docs/architecture.md). The test
process traces itself and talks to itself on loopback TCP.
"""

from __future__ import annotations

import os
import select
import threading
import time

import pytest

from otelbpf.core.events import DataEvent

pytestmark = pytest.mark.ebpf


def started_source():
    from otelbpf.sources.ebpf import CaptureConfig, EbpfSource

    src = EbpfSource(CaptureConfig(pids=[os.getpid()], capture_bytes=256, python_tasks=False, capture_tls=False))
    src.start()
    return src


@pytest.fixture(scope="module")
def source():
    src = started_source()
    assert src._reader is not None, "the ring should be read through its mapping here"
    yield src
    src.close()


@pytest.fixture(scope="module")
def callback_source():
    """A source on BCC's per-record callback, the fallback when the ring cannot be mapped."""
    from otelbpf.sources import ringbuf

    def unmappable(*_args, **_kwargs):
        raise ringbuf.RingBufError("not mapped, for this test")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ringbuf, "RingBufReader", unmappable)
        src = started_source()
    assert src._reader is None
    yield src
    src.close()


def drained(source) -> None:
    """Read until the ring stays empty (the connection's own records included)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if not source.read():
            return
    raise AssertionError("the ring never emptied")


def sleeping_flag(source) -> int:
    import ctypes

    return source._bpf["consumer_sleeping"][ctypes.c_int(0)].value


def test_the_first_record_wakes_a_sleeping_consumer(source, connection):
    client, server = connection
    drained(source)
    threading.Timer(0.3, client.sendall, args=(b"wake up",)).start()
    started = time.monotonic()
    woke = source.wait_for_records(20.0)
    waited = time.monotonic() - started
    assert woke, "the wait timed out: the record did not wake it"
    assert waited < 10.0, f"woken after {waited:.1f}s"
    assert sleeping_flag(source) == 0, "the probes must go back to submitting without wake-ups"
    sent = [e for e in source.read() if type(e) is DataEvent and e.fd == client.fileno()]
    assert sent and sent[0].data == b"wake up"
    assert server.recv(64) == b"wake up"


def test_the_first_record_wakes_a_consumer_on_bcc_callbacks(callback_source, connection):
    """The fallback reader waits in BCC's ring_buffer_poll, on the same wake-up."""
    client, server = connection
    drained(callback_source)
    threading.Timer(0.3, client.sendall, args=(b"wake up",)).start()
    started = time.monotonic()
    assert callback_source.wait_for_records(20.0), "the wait timed out: the record did not wake it"
    assert time.monotonic() - started < 10.0
    assert sleeping_flag(callback_source) == 0
    sent = [e for e in callback_source.read() if type(e) is DataEvent and e.fd == client.fileno()]
    assert sent and sent[0].data == b"wake up"
    assert server.recv(64) == b"wake up"


def test_an_empty_wait_times_out_and_an_interrupt_ends_it(source):
    drained(source)
    started = time.monotonic()
    assert source.wait_for_records(0.2) is False
    assert time.monotonic() - started >= 0.15
    wake_r, wake_w = os.pipe()
    try:
        threading.Timer(0.2, os.write, args=(wake_w, b"\0")).start()
        started = time.monotonic()
        assert source.wait_for_records(20.0, wake_r) is False
        assert time.monotonic() - started < 10.0, "the interrupt fd did not end the wait"
    finally:
        os.close(wake_r)
        os.close(wake_w)
    assert sleeping_flag(source) == 0


def test_records_do_not_wake_a_consumer_that_is_not_sleeping(source, connection):
    """Outside wait_for_records the ring's fd never becomes readable by a wake-up:
    the probes submit with BPF_RB_NO_WAKEUP, and the agent drains on its timer."""
    client, server = connection
    drained(source)
    watcher = select.epoll()
    try:
        watcher.register(source._bpf["events"].map_fd, select.EPOLLIN)  # the ring is empty: not ready now
        assert watcher.poll(0) == []
        for i in range(20):
            client.sendall(b"x%d" % i)
            server.recv(64)
        assert watcher.poll(0.3) == [], "a record woke the ring's waiters while no one slept"
        assert [e for e in source.read() if type(e) is DataEvent and e.fd == client.fileno()], "the sends were not captured"
    finally:
        watcher.close()
