"""Span export: the span encoders (OTLP protobuf, OTLP/JSON), the batch processor and the span sinks.

The transports, the JSON-lines writer and the queue are shared with the
other signals and live in ``otelbpf.otlp``; this package binds them to spans.
Typical wiring::

    sinks = [make_otlp_span_sink(args.endpoint, args.protocol), JsonFileSink("spans.jsonl")]
    processor = BatchSpanProcessor(sinks, resources, counters)
    processor.on_end(span_record)        # hot path, per finished span
    processor.shutdown(timeout_s=5.0)    # at exit
"""

from otelbpf.export.sinks import EncodedSpanBatch, SpanBatch, SpanSink, make_otlp_span_sink
from otelbpf.export.console import ConsoleSink
from otelbpf.export.encode import encode_request, serialize_request
from otelbpf.export.jsonfile import JsonFileSink, encode_json_line, from_otlp_json, read_json_file, to_otlp_json
from otelbpf.export.processor import BatchSpanProcessor
from otelbpf.otlp.transport import OtlpGrpcSink, OtlpHttpSink

__all__ = [
    "BatchSpanProcessor",
    "ConsoleSink",
    "EncodedSpanBatch",
    "JsonFileSink",
    "OtlpGrpcSink",
    "OtlpHttpSink",
    "SpanBatch",
    "SpanSink",
    "encode_json_line",
    "encode_request",
    "from_otlp_json",
    "make_otlp_span_sink",
    "read_json_file",
    "serialize_request",
    "to_otlp_json",
]
