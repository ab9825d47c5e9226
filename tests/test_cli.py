"""The command line: replay from pcap files, doctor, and clear errors for wrong input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from otelbpf.export import read_json_file

DATA = ROOT / "tests" / "data"
SERVER, CLIENT = 2, 3


def otelbpf(*args: str, user: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "otelbpf", *args]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--inh-caps=-all", *command]
    return subprocess.run(command, capture_output=True, text=True, cwd=str(ROOT), timeout=120, **kwargs)


def spans(path) -> list:
    return [
        (resource_spans.resource, span)
        for request in read_json_file(path)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


def attrs(span) -> dict:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in span.attributes}


def test_replay_keepalive_capture_gives_one_server_span_per_request(tmp_path):
    out = tmp_path / "replay.json"
    result = otelbpf("replay", str(DATA / "http_keepalive.pcap"), "--json-file", str(out))
    assert result.returncode == 0, result.stderr
    found = spans(out)
    assert [attrs(s)["url.path"] for _, s in found] == ["/a.txt", "/b.txt", "/c.txt"]
    for resource, span in found:
        assert span.kind == SERVER
        assert attrs(span)["http.response.status_code"] == 200
        assert span.end_time_unix_nano > span.start_time_unix_nano
        service = {kv.key: kv.value.string_value for kv in resource.attributes}["service.name"]
        assert service == "127.0.0.1:18081"
    sizes = [attrs(s)["http.response.body.size"] for _, s in found]
    assert sizes == [300, 5000, 100]


def test_replay_both_perspectives_gives_client_and_server_spans(tmp_path):
    out = tmp_path / "replay.json"
    result = otelbpf("replay", str(DATA / "http_post_chunked.pcap"), "--perspective", "both", "--json-file", str(out))
    assert result.returncode == 0, result.stderr
    kinds = sorted(span.kind for _, span in spans(out))
    assert kinds == [SERVER, CLIENT]
    for _, span in spans(out):
        assert attrs(span)["http.request.method"] == "POST"
        assert attrs(span)["http.response.status_code"] == 200


def test_replay_truncated_capture_is_counted_not_crashed(tmp_path):
    out = tmp_path / "replay.json"
    result = otelbpf("replay", str(DATA / "snaplen200.pcap"), "--json-file", str(out))
    assert result.returncode == 0, result.stderr
    assert '"pcap.truncated_packets": 5' in result.stderr
    assert '"otelbpf.payload.truncated"' in result.stderr


def test_replay_rejects_a_file_that_is_not_a_capture(tmp_path):
    bogus = tmp_path / "not.pcap"
    bogus.write_bytes(b"this is not a capture file at all")
    result = otelbpf("replay", str(bogus), "--json-file", str(tmp_path / "x.json"))
    assert result.returncode == 2
    assert "otelbpf:" in result.stderr and "Traceback" not in result.stderr


def test_replay_missing_file_is_a_clear_error(tmp_path):
    result = otelbpf("replay", str(tmp_path / "nope.pcap"))
    assert result.returncode == 2
    assert "nope.pcap" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["run"], "nothing to trace"),
        (["run", "--pid", "1", "--capture-bytes", "10"], "--capture-bytes must be between"),
        (["run", "--pid", "1", "--capture-bytes", "16384"], "--capture-bytes must be between 64 and 8192"),
        (["run", "--pid", "1", "--ring-buffer-mb", "3"], "power of two"),
        (["run", "--comm", "a-name-longer-than-15-bytes"], "1 to 15 bytes"),
        (["run", "--pid", "-4"], "must be > 0"),
        (["run", "--pid", "1", "--otlp-protocol", "carrier-pigeon"], "invalid choice"),
        (["run", "--pid", "1", "--duration", "soon"], "not a number"),
        (["run", "--pid", "1", "--nice", "25"], "between 0 and 19"),
        (["run", "--pid", "1", "--max-cpu", "0"], "must be > 0"),
        # profile kinds' switches (otelbpf/profiles/kinds.py): their parsers are the table's
        (["run", "--pid", "1", "--profile-hz", "2000"], "at most 1000 samples per second"),
        (["run", "--pid", "1", "--off-cpu", "--off-cpu-min", "soon"], "is not a duration"),
        (["run", "--pid", "1", "--gpu-launch-sample-every", "often"], "invalid int value"),
    ],
)
def test_wrong_flags_give_a_clear_error(args, message):
    result = otelbpf(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.ebpf
def test_unwritable_json_file_is_a_clear_error(tmp_path):
    result = otelbpf("run", "--pid", "1", "--duration", "1", "--json-file", str(tmp_path / "no" / "such" / "dir.json"))
    assert result.returncode == 2
    assert "otelbpf: output:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.ebpf
def test_otlp_protocol_from_env_is_validated():
    result = otelbpf("run", "--pid", "1", "--duration", "1", env={**os.environ, "OTEL_EXPORTER_OTLP_PROTOCOL": "json"})
    assert result.returncode == 2
    assert "grpc" in result.stderr and "http/protobuf" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.ebpf
def test_pid_that_does_not_exist_is_refused():
    result = otelbpf("run", "--pid", "4194000", "--json-file", "/dev/null")
    assert result.returncode == 1
    assert "--pid 4194000: no such process" in result.stderr


@pytest.mark.ebpf
def test_doctor_passes_as_root():
    result = otelbpf("doctor")
    assert result.returncode == 0, result.stdout
    assert "tracing can work on this host" in result.stdout
    assert "kprobes" in result.stdout


@pytest.mark.ebpf
def test_doctor_and_run_refuse_without_privileges(tmp_path):
    """As an unprivileged user the checks fail with what to do, and run refuses to start."""
    os.chmod(tmp_path, 0o777)
    doctor = otelbpf("doctor", user="65534", env={**os.environ, "HOME": str(tmp_path)})
    assert doctor.returncode == 1
    assert "[FAIL] privileges" in doctor.stdout
    assert "run as root" in doctor.stdout
    run = otelbpf("run", "--pid", "1", "--json-file", str(tmp_path / "x.json"), user="65534", env={**os.environ, "HOME": str(tmp_path)})
    assert run.returncode == 1
    assert "refusing to start" in run.stderr


YIELD = (
    "import os\n"
    "from otelbpf.cli.main import _autogroup, yield_cpu\n"
    "yield_cpu(10)\n"
    "group = _autogroup(os.getpid())\n"
    "print(os.getpriority(os.PRIO_PROCESS, 0), group[1] if group else 'none')\n"
)


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no autogroup scheduling on this kernel")
def test_yield_cpu_lowers_its_own_session_group_but_never_a_shared_one():
    alone = subprocess.run(["setsid", sys.executable, "-c", YIELD], capture_output=True, text=True, cwd=ROOT, check=True)
    assert alone.stdout.split() == ["10", "10"]  # thread and its own autogroup
    shared = subprocess.run([sys.executable, "-c", YIELD], capture_output=True, text=True, cwd=ROOT, check=True)
    thread_nice, group_nice = shared.stdout.split()
    assert thread_nice == "10" and group_nice != "10"  # the test runner's session is left alone


FAILING_START = (
    "import sys\n"
    "from otelbpf.sources import ebpf\n"
    "def start(self):\n"
    "    raise ebpf.CaptureError('cannot load the probes (test)')\n"
    "ebpf.EbpfSource.start = start\n"
    "from otelbpf.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.ebpf
@pytest.mark.parametrize("explicit", [False, True], ids=["default-page", "flamegraph-and-json"])
def test_failed_start_leaves_no_flame_graph_page(tmp_path, explicit):
    """The agent that did not start writes no (empty) flame graph page, and leaves no empty
    profiles JSON file: the profile exporters are not shut down on that path."""
    traces = tmp_path / "traces.json"
    extra = ["--flamegraph", str(tmp_path / "fg.html"), "--profiles-json-file", str(tmp_path / "p.jsonl")] if explicit else []
    result = subprocess.run(
        [sys.executable, "-c", FAILING_START, "run", "--pid", str(os.getpid()), "--json-file", str(traces), *extra],
        capture_output=True, text=True, cwd=str(ROOT), timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "cannot load the probes (test)" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], result.stderr
