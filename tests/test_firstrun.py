"""First-run mistakes get one clear message with the fix (otelbpf.cli.firstrun,
otelbpf.otlp.hints): the CLI as a user runs it, against real receivers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from otlp_receiver import OtlpReceiver, free_port

from conftest import EXAMPLES, ROOT
from otelbpf.otlp.hints import speaks, wrong_transport


def otelbpf(*args: str, cwd=ROOT, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "otelbpf", *args], capture_output=True, text=True, cwd=str(cwd), env=environment, timeout=timeout
    )


def test_endpoint_without_scheme_is_an_error_with_the_fix():
    result = otelbpf("run", "--pid", "1", "--otlp-endpoint", "collector:4317")
    assert result.returncode == 2
    assert "no http:// or https:// scheme" in result.stderr
    assert "http://collector:4317" in result.stderr
    assert "Traceback" not in result.stderr


def test_endpoint_without_scheme_from_the_environment_names_the_variable():
    result = otelbpf("run", "--pid", "1", env={"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector.observability:4317"})
    assert result.returncode == 2
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in result.stderr
    assert "http://otel-collector.observability:4317" in result.stderr


def test_missing_pid_is_refused_before_any_output_file_exists(tmp_path):
    result = otelbpf("run", "--pid", "4194000", cwd=tmp_path)
    assert result.returncode == 1
    assert "--pid 4194000: no such process" in result.stderr
    assert "writing" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_port_says_which_otlp_transport_it_speaks():
    with OtlpReceiver() as receiver:
        assert speaks("127.0.0.1", receiver.grpc_port) == "http/2"
        assert speaks("127.0.0.1", receiver.http_port) == "http/1"
        assert "use --otlp-protocol grpc" in wrong_transport(f"http://127.0.0.1:{receiver.grpc_port}/v1/traces", "http/protobuf")
        assert "use --otlp-protocol http/protobuf" in wrong_transport(f"127.0.0.1:{receiver.http_port}", "grpc")
        assert wrong_transport(f"127.0.0.1:{receiver.grpc_port}", "grpc") is None
    assert speaks("127.0.0.1", free_port()) is None


def traced_run(agent, backend, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`run --pid backend --duration 3`, curl making requests once it is attached."""
    run = agent(["--pid", str(backend.pid), "--duration", "3", *args], env=env)
    for i in range(3):
        subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{backend.port}/items/{i}"], check=False)
    rc = run.stop(timeout=120)
    return subprocess.CompletedProcess(run.proc.args, rc, "", run.output)


@pytest.mark.ebpf
def test_http_protobuf_sent_to_a_grpc_port_is_named_and_counted(agent, services):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    with OtlpReceiver(http_port=None) as receiver:
        result = traced_run(
            agent, backend, "--otlp-protocol", "http/protobuf", "--otlp-endpoint", f"http://127.0.0.1:{receiver.grpc_port}",
            "--fail-on-drop", env={"OTEL_METRICS_EXPORTER": "none"},
        )  # fmt: skip
    assert "wrong port for http/protobuf" in result.stderr and "use --otlp-protocol grpc" in result.stderr, result.stderr
    assert result.stderr.count("could not be delivered") == 1
    assert result.returncode == 3


@pytest.mark.ebpf
def test_unreachable_collector_said_once_with_the_undelivered_count(agent, services):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    result = traced_run(agent, backend, "--otlp-endpoint", f"http://127.0.0.1:{free_port()}", env={"OTEL_METRICS_EXPORTER": "none"})
    assert result.returncode == 0  # without --fail-on-drop
    assert result.stderr.count("sink otlp") <= 2 and "unreachable or refusing" in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if "could not be delivered" in line]
    assert len(lines) == 1 and int(lines[0].split("otelbpf: ")[1].split()[0]) >= 1
    assert "--fail-on-drop" in lines[0]


@pytest.mark.ebpf
def test_traces_only_backend_gets_one_metrics_hint(agent, services):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    with OtlpReceiver(http_port=None, serve_metrics=False) as receiver:
        result = traced_run(agent, backend, "--otlp-endpoint", receiver.grpc_endpoint, "--metrics-interval", "1")
        assert receiver.spans(), result.stderr
    assert result.stderr.count("OTEL_METRICS_EXPORTER=none") == 1, result.stderr
    assert "gRPC UNIMPLEMENTED" in result.stderr


def test_demo_without_curl_says_so_before_starting_anything(tmp_path):
    result = otelbpf("demo", cwd=tmp_path, env={"PATH": str(tmp_path)})
    assert result.returncode == 1
    assert "needs curl" in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_doctor_fails_when_the_probe_sources_are_missing(tmp_path):
    """An installed (non-editable) agent finds bpf/*.c through OTELBPF_BPF_DIR."""
    result = otelbpf("doctor", env={"OTELBPF_BPF_DIR": str(tmp_path)})
    assert result.returncode == 1
    assert "[FAIL] probe sources" in result.stdout and "OTELBPF_BPF_DIR" in result.stdout
