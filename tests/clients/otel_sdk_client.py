"""A client instrumented with the OpenTelemetry SDK (opentelemetry-instrumentation-requests).

Makes one GET to URL and prints the trace ID and span ID of the SDK's own
CLIENT span as JSON, so a test can check that the agent's SERVER span (on an
uninstrumented server) joined that trace under that span.
"""

import json
import sys

import requests
from opentelemetry import trace
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

finished = []


class Remember(SpanExporter):
    def export(self, spans):
        finished.extend(spans)
        return SpanExportResult.SUCCESS


def main() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Remember()))
    trace.set_tracer_provider(provider)
    RequestsInstrumentor().instrument()
    response = requests.get(sys.argv[1], timeout=10)
    client = next(s for s in finished if s.kind == trace.SpanKind.CLIENT)
    context = client.get_span_context()
    print(json.dumps({"status": response.status_code, "trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}))


if __name__ == "__main__":
    main()
