"""BatchSpanProcessor: batching, per-sink queues, retries, overflow, flush and shutdown."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_receiver import OtlpReceiver, free_port

from otelbpf.core.model import ResourceLookup, SpanKind, SpanRecord
from otelbpf.core.selfmetrics import Counters
from otelbpf.export import BatchSpanProcessor, EncodedSpanBatch, SpanBatch, SpanSink, make_otlp_span_sink
from otelbpf.export.encode import serialize_request


class StaticResources(ResourceLookup):
    def __init__(self, by_pid: Mapping[int, Mapping[str, Any]]) -> None:
        self.by_pid = by_pid

    def attributes(self, pid: int) -> Mapping[str, Any]:
        return self.by_pid.get(pid, {})


RESOURCES = StaticResources({7: {"service.name": "api"}})


def make_spans(count: int, start: int = 0) -> list[SpanRecord]:
    return [
        SpanRecord(
            trace_id=bytes(16 * [3]),
            span_id=(number + 1).to_bytes(8, "big"),
            name=f"span {number}",
            kind=SpanKind.SERVER,
            start_ns=1_700_000_000_000_000_000 + number,
            end_ns=1_700_000_000_000_001_000 + number,
            pid=7,
        )
        for number in range(start, start + count)
    ]


class RecordingSink(SpanSink):
    """In memory. ``down`` makes exports fail; ``gate`` (when set up) blocks exports until opened."""

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self.down = False
        self.gate: threading.Event | None = None
        self.raise_times = 0
        self.delivered: list[SpanRecord] = []
        self.batches: list[SpanBatch] = []
        self.attempts = 0
        self.flushed = self.shut_down = False
        self._lock = threading.Lock()

    def export(self, batch: SpanBatch) -> bool:
        with self._lock:
            self.attempts += 1
            down = self.down
            if self.raise_times:
                self.raise_times -= 1
                raise RuntimeError("sink bug")
        if self.gate is not None:
            self.gate.wait()
        if down:
            return False
        with self._lock:
            self.delivered.extend(batch.spans)
            self.batches.append(batch)
        return True

    def flush(self) -> None:
        self.flushed = True

    def shutdown(self) -> None:
        self.shut_down = True


@pytest.fixture
def counters() -> Counters:
    return Counters()


@pytest.fixture
def make_processor(counters: Counters) -> Iterator[Callable[..., BatchSpanProcessor]]:
    created: list[BatchSpanProcessor] = []

    def make(sinks: list[SpanSink], **settings: Any) -> BatchSpanProcessor:
        settings = {"schedule_delay_s": 0.05, "initial_backoff_s": 0.02, "max_backoff_s": 0.1, **settings}
        processor = BatchSpanProcessor(sinks, RESOURCES, counters, **settings)
        created.append(processor)
        return processor

    yield make
    for processor in created:
        processor.shutdown(timeout_s=1.0)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def feed(processor: BatchSpanProcessor, spans: list[SpanRecord]) -> None:
    for span in spans:
        processor.on_end(span)


def test_batches_are_sealed_when_full_or_when_the_delay_expires(make_processor: Any) -> None:
    spans = make_spans(25)
    patient_sink, quick_sink = RecordingSink("patient"), RecordingSink("quick")
    patient = make_processor([patient_sink], max_batch_size=10, schedule_delay_s=60)
    quick = make_processor([quick_sink], max_batch_size=10, schedule_delay_s=0.2)

    feed(patient, spans)
    feed(quick, spans)

    assert wait_until(lambda: len(patient_sink.delivered) == 20)  # full batches leave at once, not after a minute
    assert wait_until(lambda: len(quick_sink.delivered) == 25)  # the open tail leaves once its delay expired
    assert len(patient_sink.delivered) == 20  # ... and not before: the patient one's has not
    assert [len(batch) for batch in quick_sink.batches] == [10, 10, 5]
    assert patient_sink.delivered == spans[:20] and quick_sink.delivered == spans


def test_sinks_share_each_batch_and_thus_its_encoding(make_processor: Any) -> None:
    first, second = RecordingSink("first"), RecordingSink("second")
    processor = make_processor([first, second], max_batch_size=5)

    feed(processor, make_spans(10))
    assert processor.force_flush(timeout_s=5)

    assert len(first.batches) == 2
    assert all(a is b for a, b in zip(first.batches, second.batches))
    assert first.flushed and second.flushed


def test_nothing_that_fits_the_queue_is_lost_while_a_sink_is_down(make_processor: Any, counters: Counters) -> None:
    sink = RecordingSink()
    sink.down = True
    sink.gate = threading.Event()  # the worker's export hangs until opened: a collector that does not answer
    processor = make_processor([sink], max_batch_size=50, max_queue_size=10_000)
    spans = make_spans(2_000)

    def keep_feeding() -> None:  # spans keep coming while the sink is down
        for offset in range(50, 2_000, 200):
            feed(processor, spans[offset : offset + 200])
            time.sleep(0.02)

    feed(processor, spans[:50])
    assert wait_until(lambda: sink.attempts == 1)  # the worker is inside its first export, stuck
    feeder = threading.Thread(target=keep_feeding, daemon=True)
    feeder.start()
    feeder.join(timeout=30)
    queued_while_stuck = not feeder.is_alive() and sink.attempts == 1
    sink.gate.set()  # before asserting, so that a failure does not hang the processor's shutdown
    assert queued_while_stuck  # on_end never waits for a sink: every span was queued while the export hung
    assert wait_until(lambda: sink.attempts >= 3)
    sink.down = False
    assert processor.force_flush(timeout_s=5)

    assert sink.delivered == spans  # all of them, once each, in order
    assert counters.get("otelbpf.export.spans", "memory") == 2_000
    assert counters.get("otelbpf.export.dropped", "memory") == 0
    assert counters.get("otelbpf.export.failures", "memory") >= 3


class PayloadSink(RecordingSink):
    """Reads nothing of a batch but its payload and length, as the OTLP sinks."""

    reads_payload_only = True

    def __init__(self, name: str = "payload") -> None:
        super().__init__(name)
        self.payloads: list[bytes] = []
        self.kinds: list[type] = []

    def export(self, batch: Any) -> bool:
        self.kinds.append(type(batch))
        delivered = super().export(replace_spans(batch))
        if delivered:
            self.payloads.append(batch.payload)
        return delivered


def replace_spans(batch: Any) -> Any:
    """RecordingSink keeps ``batch.spans``; an encoded batch has none, only its parts."""
    return SpanBatch(list(getattr(batch, "parts", ())), RESOURCES) if isinstance(batch, EncodedSpanBatch) else batch


def spans_of(payloads: list[bytes]) -> list[tuple[bytes, str]]:
    """(span id, name) of every span in the decoded requests, in order."""
    out = []
    for payload in payloads:
        for resource_spans in ExportTraceServiceRequest.FromString(payload).resource_spans:
            for scope_spans in resource_spans.scope_spans:
                out += [(span.span_id, span.name) for span in scope_spans.spans]
    return out


def test_spans_are_encoded_at_seal_when_every_sink_reads_only_the_payload(make_processor: Any) -> None:
    sink = PayloadSink()
    processor = make_processor([sink], max_batch_size=10)
    assert processor.encodes_at_seal
    spans = make_spans(25)
    spans[3] = replace(spans[3], pid=8, scope="otelbpf.grpc")  # another process and scope, grouped apart

    feed(processor, spans)
    assert processor.force_flush(timeout_s=5)

    assert [len(batch) for batch in sink.batches] == [10, 10, 5]
    assert set(sink.kinds) == {EncodedSpanBatch}  # no records: the spans were encoded at seal
    assert sink.payloads == [serialize_request(spans[i : i + 10], RESOURCES) for i in (0, 10, 20)]  # the same bytes
    assert [processor.encodes_at_seal for processor in (make_processor([sink, RecordingSink()]), make_processor([]))] == [
        False,
        False,
    ]  # a sink that reads the records (the JSON file, the console) keeps them


def test_encoded_batches_overflow_and_refuse_spans_exactly_as_record_batches(make_processor: Any, counters: Counters) -> None:
    sink = PayloadSink()
    sink.down = True
    processor = make_processor([sink], max_batch_size=10, max_queue_size=100)
    spans = make_spans(250)
    bad = replace(spans[0], span_id=b"short")  # a collector would refuse the whole request

    feed(processor, [bad, *spans])
    sink.down = False
    assert processor.force_flush(timeout_s=5)

    assert spans_of(sink.payloads) == [(span.span_id, span.name) for span in spans[150:]]
    assert counters.get("otelbpf.export.dropped", "payload") == 151
    assert counters.get("otelbpf.export.spans", "payload") == 100


def test_overflow_drops_the_oldest_and_counts_exactly_how_many(make_processor: Any, counters: Counters) -> None:
    sink = RecordingSink()
    sink.down = True
    processor = make_processor([sink], max_batch_size=10, max_queue_size=100)
    spans = make_spans(250)

    feed(processor, spans)
    sink.down = False
    assert processor.force_flush(timeout_s=5)

    assert sink.delivered == spans[150:]
    assert counters.get("otelbpf.export.dropped", "memory") == 150
    assert counters.get("otelbpf.export.spans", "memory") == 100


def test_a_stuck_sink_does_not_delay_the_others(make_processor: Any, counters: Counters) -> None:
    stuck, healthy = RecordingSink("stuck"), RecordingSink("healthy")
    stuck.gate = threading.Event()
    processor = make_processor([stuck, healthy], max_batch_size=10)
    spans = make_spans(30)

    feed(processor, spans)

    assert wait_until(lambda: len(healthy.delivered) == 30)
    assert stuck.delivered == []
    stuck.gate.set()
    assert processor.force_flush(timeout_s=5)
    assert stuck.delivered == spans


def test_a_sink_that_raises_is_retried_like_a_failure(make_processor: Any, counters: Counters) -> None:
    sink = RecordingSink()
    sink.raise_times = 2
    processor = make_processor([sink], max_batch_size=5)

    feed(processor, make_spans(5))
    assert processor.force_flush(timeout_s=5)

    assert len(sink.delivered) == 5
    assert counters.get("otelbpf.export.failures", "memory") == 2


def test_on_end_never_raises_and_counts_what_it_cannot_take(make_processor: Any, counters: Counters) -> None:
    sinks = [RecordingSink("a"), RecordingSink("b")]
    processor = make_processor(sinks, max_batch_size=5)
    good = make_spans(2)
    bad_id = replace(good[0], span_id=b"\x01\x02")  # a collector would reject the whole request over this
    bad_pid = replace(good[0], pid="7")

    for item in [good[0], None, bad_id, "not a span", bad_pid, good[1]]:
        processor.on_end(item)  # type: ignore[arg-type]
    assert processor.force_flush(timeout_s=5)

    for sink in sinks:
        assert sink.delivered == good
        assert counters.get("otelbpf.export.dropped", sink.name) == 4


def test_force_flush_gives_up_at_its_timeout_and_keeps_the_spans(make_processor: Any, counters: Counters) -> None:
    sink = RecordingSink()
    sink.down = True
    processor = make_processor([sink], max_batch_size=5)
    feed(processor, make_spans(10))

    started = time.monotonic()
    assert processor.force_flush(timeout_s=0.3) is False
    assert time.monotonic() - started < 1.0

    assert counters.get("otelbpf.export.dropped", "memory") == 0
    sink.down = False
    assert processor.force_flush(timeout_s=5)
    assert len(sink.delivered) == 10


def test_shutdown_delivers_what_is_queued_then_refuses_new_spans(make_processor: Any, counters: Counters) -> None:
    sink = RecordingSink()
    processor = make_processor([sink], max_batch_size=100, schedule_delay_s=60)

    feed(processor, make_spans(30))
    processor.shutdown(timeout_s=5)
    processor.on_end(make_spans(1)[0])
    processor.shutdown(timeout_s=5)  # idempotent

    assert len(sink.delivered) == 30 and sink.shut_down
    assert counters.get("otelbpf.export.dropped", "memory") == 1


@pytest.fixture
def blackhole_port() -> Iterator[int]:
    """A port that accepts TCP connections (kernel backlog) but never answers: exports hang there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield int(listener.getsockname()[1])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_shutdown_with_an_unresponsive_collector_returns_in_time_and_counts_the_loss(
    make_processor: Any, counters: Counters, blackhole_port: int, protocol: str
) -> None:
    sink = make_otlp_span_sink(f"http://127.0.0.1:{blackhole_port}", protocol, timeout_s=30)
    processor = make_processor([sink], max_batch_size=10)
    feed(processor, make_spans(50))
    time.sleep(0.1)  # let the worker get stuck inside an export

    started = time.monotonic()
    processor.shutdown(timeout_s=1.0)
    elapsed = time.monotonic() - started

    assert elapsed < 1.5
    assert counters.get("otelbpf.export.spans", "otlp") == 0
    assert counters.get("otelbpf.export.dropped", "otlp") == 50


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_that_comes_up_late_receives_every_span_once(
    make_processor: Any, counters: Counters, protocol: str
) -> None:
    port = free_port()
    sink = make_otlp_span_sink(f"http://127.0.0.1:{port}", protocol, timeout_s=0.3)
    processor = make_processor([sink], max_batch_size=50)
    spans = make_spans(600)

    for offset in range(0, 600, 100):  # spans keep coming while the collector is down
        feed(processor, spans[offset : offset + 100])
        time.sleep(0.05)
    assert counters.get("otelbpf.export.failures", "otlp") >= 1

    grpc_port, http_port = (port, None) if protocol == "grpc" else (None, port)
    with OtlpReceiver(grpc_port=grpc_port, http_port=http_port) as receiver:
        assert processor.force_flush(timeout_s=15)
        received = receiver.spans()

    assert sorted(item.span.span_id for item in received) == [span.span_id for span in spans]
    assert counters.get("otelbpf.export.spans", "otlp") == 600
    assert counters.get("otelbpf.export.dropped", "otlp") == 0


def test_batch_settings_come_from_otel_bsp_env_unless_given(
    make_processor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "not-a-number")  # ignored with a warning
    from_env, explicit = RecordingSink("env"), RecordingSink("explicit")

    processor = BatchSpanProcessor([from_env], RESOURCES, Counters(), initial_backoff_s=0.02)
    feed(processor, make_spans(10))
    assert wait_until(lambda: len(from_env.delivered) == 10, timeout=2)  # the 20 ms delay sealed the tail
    processor.shutdown()
    overridden = make_processor([explicit], max_batch_size=5)
    feed(overridden, make_spans(10))
    assert overridden.force_flush(timeout_s=5)

    assert [len(batch) for batch in from_env.batches] == [4, 4, 2]
    assert [len(batch) for batch in explicit.batches] == [5, 5]
