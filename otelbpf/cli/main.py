"""Command line: `otelbpf doctor | run | replay | demo`.

A command imports the layers it runs when it runs (``cmd_run``, ``cmd_replay``): the
eBPF source loads BCC, and the pipeline and export layers weigh ~150 ms and ~27 MB, which
``otelbpf --help`` and ``otelbpf doctor`` need not pay.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from otelbpf import __version__
from otelbpf.cli import doctor, firstrun, outputs
from otelbpf.cli.demo import run_demo
from otelbpf.durations import parse_duration_ns
from otelbpf.otlp import OTLP_TRANSPORTS
from otelbpf.profiles.kinds import PROFILE_KINDS, add_switches as add_profile_switches
from otelbpf.runtime import gctune
from otelbpf.semantics import gpu_steps

log = logging.getLogger("otelbpf")



def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


#: The agent yields the CPU to the services it traces (README "Usage").
DEFAULT_NICE = 10
#: CUDA calls shorter than this are folded into their request span (an idle synchronisation, a
#: small async copy's enqueue, a cached allocator's free: docs/gpu.md "Short calls folded").
DEFAULT_GPU_MIN_CALL_DURATION = "50us"


def _nice_value(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= 19:
        raise argparse.ArgumentTypeError(f"must be between 0 and 19, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def _duration_ns(text: str) -> int:
    try:
        return parse_duration_ns(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_output_options(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output (with none given: --console and --json-file %s)" % outputs.DEFAULT_JSON_FILE)
    out.add_argument("--otlp-endpoint", metavar="URL", help="send OTLP here (default from OTEL_EXPORTER_OTLP_*)")
    out.add_argument("--otlp-protocol", choices=OTLP_TRANSPORTS, help="OTLP transport (default grpc, or OTEL_EXPORTER_OTLP_PROTOCOL)")
    out.add_argument("--json-file", metavar="PATH", help="write OTLP JSON, one ExportTraceServiceRequest per line")
    out.add_argument("--console", action="store_true", help="print a readable tree per trace")
    out.add_argument(
        "--metrics-interval",
        type=_positive_float,
        metavar="SECONDS",
        help="export OTLP metrics this often (default OTEL_METRIC_EXPORT_INTERVAL, else 60)",
    )
    out.add_argument("--metrics-json-file", metavar="PATH", help="also write the metrics as OTLP JSON lines here")
    out.add_argument(
        "--include-query-strings",
        action="store_true",
        help="export URL query strings (off by default: they often carry tokens and personal data)",
    )
    out.add_argument(
        "--capture-genai-content",
        action="store_true",
        help="export LLM prompt and completion text (gen_ai.input/output.messages, truncated; off by default)",
    )


def _add_profile_options(p: argparse.ArgumentParser, kinds=PROFILE_KINDS) -> None:
    """Each profile kind's switches (the table in otelbpf/profiles/kinds.py), then the options
    every kind shares."""
    prof = p.add_argument_group(
        "profiles (CPU flame graphs of traced processes, each sample linked to its request span; docs/profiles.md)"
    )
    add_profile_switches(prof, kinds)
    prof.add_argument("--no-profiles", action="store_true", help="take no stack samples (no profiles)")
    prof.add_argument(
        "--profile-ring-mb",
        type=_positive_int,
        default=4,
        metavar="MB",
        help="ring buffer for stack samples, a power of two (default 4: ~100 samples of 32 KiB stacks "
        "ahead of the agent; a full ring counts otelbpf.profiles.lost)",
    )
    prof.add_argument(
        "--profile-interval",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="export the profiles gathered this often (default 10)",
    )
    prof.add_argument(
        "--publish-trace-context",
        action="store_true",
        help="publish which span each thread serves in the pinned BPF map /sys/fs/bpf/traces_ctx_v1 (OBI's format), "
        "so an OpenTelemetry eBPF profiler beside the agent links its samples to these spans",
    )
    prof.add_argument("--profiles-json-file", metavar="PATH", help="write OTLP JSON, one ExportProfilesServiceRequest per line")
    prof.add_argument("--pprof-dir", metavar="DIR", help="write a gzipped pprof file per process and profile type each interval")
    prof.add_argument(
        "--flamegraph",
        metavar="FILE.html",
        help="write an interactive flame graph page at exit (with no profile output given: beside the traces file)",
    )


def _add_propagation_options(p: argparse.ArgumentParser) -> None:
    from otelbpf.sources.crossnode import MODES, default_mode

    prop = p.add_argument_group("cross-node traces (docs/cross-node.md)")
    prop.add_argument(
        "--propagation",
        choices=list(MODES),
        default=default_mode(),
        help="put each traced request's trace context on the wire, in OBI's formats, so that the agent on the "
        "other node joins its trace: tcp (default; a TCP option on the request's first segment, any TCP: TLS and "
        "HTTP/2 included), headers (a traceparent header in plaintext HTTP/1 requests that carry none), all, or "
        "off (nothing written). `otelbpf doctor` says what works on this node",
    )
    prop.add_argument(
        "--propagation-cgroup",
        metavar="PATH",
        help="the cgroup (v2) whose sockets the propagation's sock_ops program sees (default: the root, every "
        "process of the host; traced processes only are ever touched)",
    )


def _add_exclusion_options(p: argparse.ArgumentParser) -> None:
    exc = p.add_argument_group(
        "never traced (default: the agent, otelcol* and the OTLP endpoint's traffic; see docs/kubernetes.md)"
    )
    exc.add_argument("--exclude-comm", action="append", default=[], metavar="NAME[*]", help="processes with this name or prefix; repeatable")
    exc.add_argument("--exclude-pid", type=_positive_int, action="append", default=[], help="a process and its children; repeatable")
    exc.add_argument("--exclude-port", type=_positive_int, action="append", default=[], help="TCP connections with this port at either end; repeatable")
    exc.add_argument("--no-default-excludes", action="store_true", help="trace otelcol* and the OTLP endpoint's traffic too")
    exc.add_argument(
        "--fail-on-drop",
        action="store_true",
        help="exit with status 3 when spans could not be delivered (collector unreachable at exit)",
    )


def build_exclusions(args):
    """The exclusions ``run`` applies: the user's, plus the default list."""
    from otelbpf.host.exclusions import DEFAULT_EXCLUDED_COMMS, Exclusions, endpoint_addresses

    exclusions = Exclusions(comms=list(args.exclude_comm), pids=list(args.exclude_pid), ports=set(args.exclude_port))
    if not args.no_default_excludes:
        exclusions.comms += [c for c in DEFAULT_EXCLUDED_COMMS if c not in exclusions.comms]
        if outputs.wants_otlp(args):
            endpoint, port = firstrun.otlp_endpoint_and_port(args.otlp_endpoint, args.otlp_protocol)
            if endpoint:
                exclusions.endpoints = endpoint_addresses(endpoint, port)
    exclusions.validate()
    return exclusions


def build_parser(profile_kinds=PROFILE_KINDS) -> argparse.ArgumentParser:
    """The command line; ``run``'s profile switches are those of ``profile_kinds``."""
    parser = argparse.ArgumentParser(prog="otelbpf", description="Zero-code eBPF tracing, exported as OpenTelemetry.")
    parser.add_argument("--version", action="version", version=f"otelbpf {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("doctor", help="check that this host can trace, and say what is missing")

    run = sub.add_parser("run", help="trace processes and export spans")
    sel = run.add_argument_group("what to trace (processes started later are traced too when they match)")
    sel.add_argument("--pid", type=_positive_int, action="append", default=[], help="a process (and its children); repeatable")
    sel.add_argument("--comm", action="append", default=[], help="processes with this name (as in ps -o comm); repeatable")
    sel.add_argument("--all", action="store_true", help="every process but the agent itself")
    _add_exclusion_options(run)
    run.add_argument("--duration", type=_positive_float, metavar="SECONDS", help="stop after this long, flushing everything")
    run.add_argument("--capture-bytes", type=_positive_int, default=4096, metavar="N", help="payload bytes captured per syscall (64..8192, default 4096)")
    run.add_argument(
        "--no-whole-capture",
        action="store_true",
        help="keep the --capture-bytes prefix of every read and write, even on connections carrying LLM calls"
        " (whole capture of their bursts keeps usage intact; docs/genai.md)",
    )
    run.add_argument("--ring-buffer-mb", type=_positive_int, default=16, metavar="MB", help="kernel ring buffer size, a power of two (default 16)")
    run.add_argument("--max-connections", type=_positive_int, default=16384, help="connection table bound (default 16384)")
    run.add_argument(
        "--no-fast-path",
        action="store_true",
        help="parse all traffic with the reference parsers, not the compiled fast path (docs/fastpath.md)",
    )
    run.add_argument(
        "--udp",
        action="store_true",
        help="also capture UDP datagrams (DDS/RTPS); needs per-syscall tracepoints, which tax every syscall on the host",
    )
    run.add_argument("--no-unix-sockets", action="store_true", help="trace TCP only, not Unix domain sockets")
    _add_propagation_options(run)
    run.add_argument(
        "--no-python-tasks",
        action="store_true",
        help="do not probe CPython asyncio task steps (used to link calls made by asyncio servers)",
    )
    run.add_argument(
        "--no-tls",
        action="store_true",
        help="do not probe OpenSSL for TLS plaintext (SSL_read/SSL_write uprobes; on by default)",
    )
    run.add_argument(
        "--no-gpu",
        action="store_true",
        help="do not probe CUDA runtime/driver and NCCL calls (uprobes; on by default, docs/gpu.md)",
    )
    gpu_steps.add_arguments(run)
    run.add_argument(
        "--gpu-launch-time",
        action="store_true",
        help="also measure the time inside GPU kernel launch calls (entry + return probes: ~4.5 us more per launch "
        "on an H100, against ~nothing for the default count; docs/gpu.md)",
    )
    run.add_argument(
        "--gpu-min-call-duration",
        type=_duration_ns,
        default=DEFAULT_GPU_MIN_CALL_DURATION,
        metavar="DURATION",
        help="CUDA calls shorter than this (e.g. 50us, 1ms; default 50us; 0: export all) are not exported one by one: "
        "their request span carries how many and their time, per function; metrics still count them",
    )
    run.add_argument(
        "--max-cpu",
        type=_positive_float,
        metavar="CORES",
        help="CPU budget of the agent in cores (e.g. 0.5): over it, trace fewer connections (counted), never slow the app",
    )
    run.add_argument(
        "--nice",
        type=_nice_value,
        default=DEFAULT_NICE,
        metavar="N",
        help=f"the agent's scheduling niceness, 0..19 (default {DEFAULT_NICE}): on a busy core the traced services win "
        "the CPU, and what the agent cannot keep up with is dropped in the kernel and counted",
    )
    run.add_argument(
        "--health-port",
        type=_positive_int,
        metavar="PORT",
        help="serve /healthz, /readyz and Prometheus /metrics (self-metrics) on this port",
    )
    run.add_argument(
        "--prometheus-port",
        type=_positive_int,
        metavar="PORT",
        help="serve every metric the agent exports (span, GPU, NCCL and self-metrics) for Prometheus to scrape, at "
        "/metrics on this port, named as OpenTelemetry's Prometheus compatibility says (may be the --health-port)",
    )
    run.add_argument(
        "--nccl-ras-interval",
        type=_non_negative_float,
        default=30.0,
        metavar="SECONDS",
        help="ask NCCL's RAS (localhost:28028 in each traced NCCL job's network namespace) this often for every "
        "rank's collective counts and missing ranks (default 30: RAS has crashed under tight polling; 0: never)",
    )
    run.add_argument("--stats-interval", type=_positive_float, metavar="SECONDS", help="log the self-metrics this often")
    run.add_argument(
        "--discard-events",
        action="store_true",
        help="benchmarking aid: capture in the kernel as usual, read every record and drop it undecoded (no spans; "
        "counted in otelbpf.events.discarded): what the kernel capture alone costs the traced app",
    )
    _add_output_options(run)
    _add_profile_options(run, profile_kinds)

    from otelbpf.profiles.diff import add_parser as add_profiles_parser

    add_profiles_parser(sub)  # otelbpf profiles diff BASE NEW

    replay = sub.add_parser("replay", help="run the same pipeline on a pcap/pcapng capture")
    replay.add_argument("pcap", help="capture file (pcap or pcapng)")
    replay.add_argument(
        "--perspective",
        choices=["server", "client", "both"],
        default="server",
        help="which endpoint's spans to build: servers (SERVER spans), clients (CLIENT spans) or both",
    )
    _add_output_options(replay)

    demo = sub.add_parser("demo", help="trace the bundled example services and show the traces")
    demo.add_argument("--requests", type=_positive_int, default=20, help="requests to drive through the gateway")
    demo.add_argument("--json-file", default="otelbpf-demo.json", metavar="PATH", help="OTLP JSON output")
    demo.add_argument("--otlp-endpoint", metavar="URL", help="also send OTLP here")
    demo.add_argument("--otlp-protocol", choices=OTLP_TRANSPORTS)
    demo.add_argument("--metrics-json-file", metavar="PATH", help="also write the metrics as OTLP JSON lines here")
    demo.add_argument("--flamegraph", metavar="FILE.html", help="the flame graph page (default: beside the JSON file)")
    demo.add_argument("--dds", action="store_true", help="also run a camera -> detector -> planner DDS pipeline (needs cyclonedds)")
    return parser


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), format="%(message)s", stream=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    if args.command == "doctor":
        return cmd_doctor()
    if args.command == "run":
        return cmd_run(args)
    if args.command == "replay":
        return cmd_replay(args)
    if args.command == "profiles":
        from otelbpf.profiles.diff import run as run_profiles_diff

        return run_profiles_diff(args)
    if args.command == "demo":
        return run_demo(args)
    return 2


def cmd_doctor() -> int:
    checks = doctor.run_checks()
    print(doctor.format_report(checks))
    return 1 if doctor.failures(checks) else 0




def yield_cpu(niceness: int) -> None:
    """Lower the agent's scheduling priority to ``niceness`` (Linux applies it
    to this thread and to the threads it creates later). On a core shared with
    the services, CFS then gives them the CPU first: under overload the agent
    falls behind, the kernel ring buffer drops and counts, and the services
    are not slowed further. The BPF programs run in the services' own
    context and are not affected.

    With autogroup scheduling (``kernel.sched_autogroup_enabled``), CFS first
    shares a core between sessions, and a thread's niceness only counts
    inside its own session's group. When the agent is alone in its session
    (started by a supervisor, ``setsid``, a container entrypoint), the
    group's niceness is lowered too; a session shared with other processes
    is left alone, as they would pay for it. Across cgroups (containers),
    CPU weights and limits decide: give the agent its own (the DaemonSet
    sets them)."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness > current:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    group = _autogroup(os.getpid())
    if group is not None and niceness > group[1] and _alone_in_autogroup(group[0]):
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(niceness))
        except OSError as exc:
            log.debug("could not lower the autogroup's priority: %s", exc)


def _autogroup(pid: int) -> tuple[str, int] | None:
    """(autogroup name, its niceness) of a process, or None (no autogroup scheduling)."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            name, _, nice = f.read().split()
        return name, int(nice)
    except (OSError, ValueError):
        return None


def _alone_in_autogroup(name: str) -> bool:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            group = _autogroup(int(entry))
            if group is not None and group[0] == name:
                return False
    return True


def cmd_run(args) -> int:
    from otelbpf.core.selfmetrics import Counters
    from otelbpf.host.exclusions import ExcludingSource
    from otelbpf.host.resources import ProcessResources
    from otelbpf.assembly import GpuOptions, attach_profiles, build_pipeline
    from otelbpf.profiles.kinds import ProfileError
    from otelbpf.runtime.agent import Agent
    from otelbpf.runtime.budget import CpuBudget
    from otelbpf.runtime.health import Heartbeat
    from otelbpf.semantics import SpanOptions, gpu
    from otelbpf.sources.ebpf import CaptureConfig, CaptureError, EbpfSource

    yield_cpu(args.nice)  # first: every thread created from here on inherits it
    try:
        firstrun.check_output_options(args)
        exclusions = build_exclusions(args)
    except ValueError as exc:
        print(f"otelbpf: {exc}", file=sys.stderr)
        return 2
    config = CaptureConfig(
        pids=args.pid,
        comms=args.comm,
        trace_all=args.all,
        capture_bytes=args.capture_bytes,
        whole_capture=not args.no_whole_capture,
        ring_buffer_mb=args.ring_buffer_mb,
        capture_unix=not args.no_unix_sockets,
        capture_udp=args.udp,
        python_tasks=not args.no_python_tasks,
        capture_tls=not args.no_tls,
        capture_gpu=not args.no_gpu,
        gpu_launch_time=args.gpu_launch_time,
        exclude_comms=exclusions.comms,
        exclude_pids=exclusions.pids,
        profiles=outputs.profile_config(args),
        propagation=args.propagation,
        propagation_cgroup=args.propagation_cgroup,
    )
    try:
        config.validate()
    except ValueError as exc:
        print(f"otelbpf: {exc}", file=sys.stderr)
        return 2
    try:
        firstrun.check_pids_exist(args.pid)  # before any output file exists
    except ValueError as exc:
        print(f"otelbpf: {exc}", file=sys.stderr)
        return 1
    if not doctor.preflight():
        return 1
    if config.profiles.publish_trace_context:
        from otelbpf.profiles.tracectx import ensure_bpffs

        try:
            ensure_bpffs()
        except OSError as exc:
            print(f"otelbpf: {exc}", file=sys.stderr)
            return 1
    counters = Counters()
    resources = ProcessResources()
    try:
        consumer, metrics = outputs.build_consumer(args, resources, counters)
    except (ValueError, OSError) as exc:
        print(f"otelbpf: output: {exc}", file=sys.stderr)
        return 2

    ebpf = EbpfSource(config)
    source = Heartbeat(ExcludingSource(ebpf, exclusions, counters))
    try:
        servers = start_http_servers(args, source, counters, metrics)
    except OSError as exc:
        print(f"otelbpf: --health-port/--prometheus-port: {exc}", file=sys.stderr)
        consumer.shutdown(1.0)
        return 2
    log.info("otelbpf: never traced: the agent; %s", exclusions.describe())
    options = SpanOptions(include_query=args.include_query_strings, capture_genai_content=args.capture_genai_content)
    from otelbpf import fastpath

    if args.no_fast_path:
        fastpath.set_enabled(False)
    if fastpath.available():
        log.info("otelbpf: HTTP/1 %s", fastpath.describe())
    else:  # said once: a stale or missing build costs every HTTP/1 request
        log.warning("otelbpf: HTTP/1 %s", fastpath.describe())
        counters.add("otelbpf.fastpath.unavailable")
    gpu_options = GpuOptions(args.gpu_min_call_duration, gpu_steps.options_from(args))
    pipeline = build_pipeline(consumer, resources, counters, options=options, source=source,
                              max_connections=args.max_connections, gpu_options=gpu_options)  # fmt: skip
    if config.profiles.enabled:
        try:
            profile_exporter, flamegraph = outputs.build_profile_exporters(args, counters)
        except (ValueError, OSError) as exc:
            print(f"otelbpf: profiles output: {exc}", file=sys.stderr)
            consumer.shutdown(1.0)
            return 2
        if flamegraph:
            log.info("otelbpf: the flame graph will be written to %s at exit", flamegraph)
    gpu_state = gpu.state_of(pipeline)
    budget = CpuBudget(args.max_cpu, pipeline.table) if args.max_cpu else None
    if metrics is not None:
        metrics.add_gauge("otelbpf.connections.open", lambda: len(pipeline.table))
        if gpu_state is not None:  # GPU memory reserved and kernel launches per process (docs/gpu.md)
            from otelbpf.sources.gpu import launch_sums

            metrics.add_process_gauges(gpu_state.memory_gauges, resources.attributes)
            metrics.add_process_sums(lambda: launch_sums(ebpf), resources.attributes)
            metrics.add_agent_points(gpu_state.collectives.metric_points)  # each joined rank's communicator size
        if budget is not None:
            metrics.add_gauge("otelbpf.budget.shed_ratio", lambda: budget.shed_ratio)
    agent = Agent(source, pipeline, consumer, counters, stats_interval_s=args.stats_interval, budget=budget,
                  discard_from=ebpf if args.discard_events else None)  # fmt: skip
    if args.discard_events:
        log.warning("otelbpf: --discard-events: every captured record is dropped undecoded, no spans (a benchmarking aid)")
    agent.install_signal_handlers()
    started = time.monotonic()
    try:
        probes = source.start()
    except (CaptureError, ProfileError) as exc:
        print(f"otelbpf: {exc}", file=sys.stderr)
        consumer.shutdown(1.0)
        if config.profiles.enabled:
            # not shut down: that writes the flame graph page, empty (its thread is a daemon); an
            # empty --profiles-json-file goes like the other empty outputs
            profiles_file = getattr(args, "profiles_json_file", None)
            if profiles_file and os.path.isfile(profiles_file) and os.path.getsize(profiles_file) == 0:
                os.unlink(profiles_file)
        firstrun.remove_empty_outputs(args)
        for server in servers:
            server.close()
        return 1
    source.ready = True
    if config.profiles.enabled:
        attach_profiles(pipeline, ebpf.profiles, [profile_exporter], resources, counters, config.profiles.hz,
                        interval_s=args.profile_interval)  # fmt: skip
    if config.profiles.publish_trace_context:
        from otelbpf.profiles.tracectx import TraceContextPublisher

        TraceContextPublisher(ebpf.table("traces_ctx_v1")).attach(pipeline.linker)
    ras = start_nccl_ras(args, ebpf, pipeline, counters, metrics) if not args.no_gpu else None
    gctune.tune()  # start-up is over: fewer cycle collections on the hot path (otelbpf/runtime/gctune.py)
    from otelbpf.sources.memory import trim_heap

    trim_heap()  # and what start-up allocated and freed goes back to the kernel (otelbpf/sources/memory.py)
    log.info("otelbpf: tracing, %d probes attached (%.1fs)", probes, time.monotonic() - started)
    try:
        agent.run(args.duration)
    finally:
        if ras is not None:
            ras.stop()
        stats = agent.stats()
        log.info("otelbpf: stats %s", json.dumps(stats))
        source.close()
        for server in servers:
            server.close()
    return firstrun.exit_status(stats, args.fail_on_drop)


def start_http_servers(args, source, counters, metrics) -> list:
    """The health server (--health-port) and the Prometheus endpoint (--prometheus-port): one
    server when the ports are the same, its /metrics then serving every metric."""
    from otelbpf.runtime.health import HealthServer

    servers = []
    everything = None
    if args.prometheus_port and metrics is not None:
        from otelbpf.metrics.prometheus import PrometheusEndpoint

        everything = PrometheusEndpoint(metrics).text
    try:
        if args.health_port and args.health_port != args.prometheus_port:
            servers.append(HealthServer(args.health_port, source, counters).start())
        if args.prometheus_port:
            server = HealthServer(args.prometheus_port, source, counters, metrics_text=everything)
            servers.append(server.start("health and every exported metric (Prometheus)"))
    except OSError:
        for server in servers:
            server.close()
        raise
    return servers


def start_nccl_ras(args, ebpf, pipeline, counters, metrics):
    """Ask NCCL's RAS in the traced NCCL jobs' network namespaces (docs/gpu.md); None with
    --nccl-ras-interval 0."""
    if not args.nccl_ras_interval:
        return None
    from otelbpf.assembly import attach_nccl_ras
    from otelbpf.sources.nccl_ras import RasPoller

    poller = RasPoller(ebpf.nccl_pids, counters, args.nccl_ras_interval, to_event_ns=ebpf.event_time_ns)
    attach_nccl_ras(pipeline, poller)
    if metrics is not None:
        metrics.add_agent_points(poller.metric_points)
    return poller.start()


def cmd_replay(args) -> int:
    from otelbpf.cli.replay import replay_resources, run_replay
    from otelbpf.core.selfmetrics import Counters
    from otelbpf.semantics import SpanOptions
    from otelbpf.sources.pcap import PcapError, PcapSource

    counters = Counters()
    try:
        source = PcapSource(args.pcap, perspective=args.perspective)
        resources = replay_resources(source)
        consumer, _metrics = outputs.build_consumer(args, resources, counters)
    except (ValueError, OSError, PcapError) as exc:
        print(f"otelbpf: {exc}", file=sys.stderr)
        return 2
    try:
        run_replay(
            source,
            consumer,
            resources,
            counters,
            SpanOptions(include_query=args.include_query_strings, capture_genai_content=args.capture_genai_content),
        )
    except PcapError as exc:
        print(f"otelbpf: {exc}", file=sys.stderr)
    consumer.shutdown(10.0)
    stats = counters.as_dict()
    stats.update({f"pcap.{k}": v for k, v in source.stats.items()})
    log.info("otelbpf: stats %s", json.dumps(stats))
    return 0


def replay_attributes(source, pid: int) -> dict:
    """Resource attributes of a replayed capture's synthetic process (see otelbpf.cli.replay)."""
    from otelbpf.cli.replay import replay_attributes as attributes

    return attributes(source, pid)


if __name__ == "__main__":
    sys.exit(main())
