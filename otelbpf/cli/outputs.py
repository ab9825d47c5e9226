"""The outputs ``otelbpf run`` (and the demo) send to, built from the command line's options.

Spans go to the batch span processor and its sinks (OTLP, a JSON lines file, the console),
span metrics to the metric sinks, profiles to the profile exporters on a thread of their
own. Where no output is asked for, the embedded default writes traces to
``otelbpf-traces.json`` and prints them, and the flame graph lands beside that file.

The export, metrics and profile layers are imported when an output is built, not when
this module is: ``otelbpf --help`` and ``otelbpf doctor`` then start in ~60 ms instead
of ~200 ms.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("otelbpf")

#: The traces file of the embedded default (no output option, no OTEL_* variable).
DEFAULT_JSON_FILE = "otelbpf-traces.json"


def otlp_configured_by_env() -> bool:
    """Standard OTel variables that ask for OTLP export."""
    env = os.environ
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "otlp":
        return True
    return any(
        env.get(name)
        for name in (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        )
    )


def build_sinks(args, default_to_console: bool = True):
    """The span sinks the output options (and OTEL_* variables) ask for, or
    the embedded default: a console tree and an OTLP JSON file."""
    from otelbpf.export import ConsoleSink, JsonFileSink, make_otlp_span_sink

    sinks = []
    if wants_otlp(args):
        sinks.append(make_otlp_span_sink(args.otlp_endpoint, args.otlp_protocol))
    if getattr(args, "json_file", None):
        sinks.append(JsonFileSink(args.json_file))
    if getattr(args, "console", False):
        sinks.append(ConsoleSink())
    if not sinks and default_to_console:
        sinks = [ConsoleSink(), JsonFileSink(DEFAULT_JSON_FILE)]
        log.info("otelbpf: no output configured: printing traces and writing %s", DEFAULT_JSON_FILE)
    return sinks


def wants_otlp(args) -> bool:
    return bool(getattr(args, "otlp_endpoint", None) or getattr(args, "otlp_protocol", None) or otlp_configured_by_env())


def build_metric_sinks(args):
    """OTLP metrics go wherever OTLP traces go (unless OTEL_METRICS_EXPORTER=none);
    --metrics-json-file adds a file."""
    from otelbpf.metrics import MetricsJsonFileSink, make_otlp_metric_sink

    sinks = []
    metrics_off = os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower() == "none"
    if wants_otlp(args) and not metrics_off:
        sinks.append(make_otlp_metric_sink(args.otlp_endpoint, args.otlp_protocol))
    if getattr(args, "metrics_json_file", None):
        sinks.append(MetricsJsonFileSink(args.metrics_json_file))
    return sinks


def build_consumer(args, resources, counters, default_to_console: bool = True):
    """Everything a finished span goes to: the batch span processor, and the
    span metrics with their exporter when metrics have somewhere to go (a sink,
    or Prometheus scraping them: --prometheus-port).
    Raises ValueError/OSError for bad output options."""
    from otelbpf.export import BatchSpanProcessor
    from otelbpf.metrics import MeteredProcessor, MetricsExporter, SpanMetrics, agent_resource_attributes
    from otelbpf.registry import default_instruments

    processor = BatchSpanProcessor(build_sinks(args, default_to_console), resources, counters)
    metric_sinks = build_metric_sinks(args)
    if not metric_sinks and not getattr(args, "prometheus_port", None):  # Prometheus scrapes collections itself
        return processor, None
    span_metrics = SpanMetrics(resources, default_instruments())
    exporter = MetricsExporter(
        span_metrics, counters, agent_resource_attributes(), metric_sinks, interval_s=getattr(args, "metrics_interval", None)
    )
    return MeteredProcessor(processor, span_metrics, exporter), exporter


def profile_config(args, config_class=None):
    """What the profile options ask the kernel for (``hz`` 0: no profiles): each kind's
    settings from its switches (otelbpf/profiles/kinds.py), and the shared options."""
    if config_class is None:
        from otelbpf.profiles.sampler import ProfileConfig as config_class

    return config_class.from_args(
        args, ring_mb=getattr(args, "profile_ring_mb", 4), publish_trace_context=args.publish_trace_context
    )


def default_flamegraph_path(args) -> str:
    """Beside the traces file: otelbpf-traces.json -> otelbpf-traces.flamegraph.html."""
    traces = getattr(args, "json_file", None) or DEFAULT_JSON_FILE
    stem = traces[: -len(".json")] if traces.endswith(".json") else traces
    return stem + ".flamegraph.html"


def build_profile_exporters(args, counters):
    """The profile exporters the options ask for, on a thread of their own.
    OTLP profiles go wherever OTLP traces go (unless OTEL_PROFILES_EXPORTER=none);
    with no profile output at all, the flame graph is written beside the traces
    file. Returns (exporter or None, the flame graph path or None)."""
    from otelbpf.profiles.export import BackgroundExporter, make_profile_exporters

    otlp = wants_otlp(args) and os.environ.get("OTEL_PROFILES_EXPORTER", "").strip().lower() != "none"
    flamegraph = getattr(args, "flamegraph", None)
    json_file = getattr(args, "profiles_json_file", None)
    pprof_dir = getattr(args, "pprof_dir", None)
    if not (otlp or json_file or pprof_dir or flamegraph):
        flamegraph = default_flamegraph_path(args)
    if pprof_dir:
        os.makedirs(pprof_dir, exist_ok=True)
    exporters = make_profile_exporters(
        otlp_endpoint=args.otlp_endpoint if otlp else None,
        otlp_protocol=args.otlp_protocol if otlp else None,
        otlp=otlp,
        json_file=json_file,
        pprof_dir=pprof_dir,
        flamegraph_file=flamegraph,
        counters=counters,
    )
    return BackgroundExporter(exporters, counters=counters), flamegraph
