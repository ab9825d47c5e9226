"""The shipped Prometheus rules (deploy/prometheus/otelbpf-rules.yaml) evaluated by Debian's
real ``promtool`` on series shaped like the agents' (per rank and communicator, each rank's
node in ``host_name``): the rank that holds a communicator back is named with its node and
kind, and nothing is named where it must not be (a rank not measured, balanced ranks).

The end-to-end check, real agents scraped by a real Prometheus, is tests/test_ebpf_ranks.py.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from conftest import ROOT

RULES = ROOT / "deploy" / "prometheus" / "otelbpf-rules.yaml"
COMM = "3f9a1c2e00aa11bb"
NODES = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
STEP = "15s"
STEPS = 60  # 15 minutes of samples


@pytest.fixture(scope="module")
def promtool():
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian's prometheus package; scripts/install.sh installs it)")
    return tool


def rank_series(rank: int, seconds: dict[str, float], nranks: int = 4, comm: str = COMM) -> list[dict]:
    """One rank's otelbpf_nccl_time_seconds _sum and _count per state (a collective each 15 s, for
    simplicity: only the ratio matters), and its otelbpf_nccl_ranks."""
    labels = (f'otelbpf_nccl_comm_hash="{comm}",otelbpf_nccl_rank="{rank}",otelbpf_nccl_nranks="{nranks}",'
              f'host_name="{NODES[rank]}",job="nccl_ranks",instance="proc-{rank}"')  # fmt: skip
    out = [{"series": f"otelbpf_nccl_ranks{{{labels}}}", "values": f"{nranks}x{STEPS}"}]
    for state, value in seconds.items():
        out.append({"series": f'otelbpf_nccl_time_seconds_sum{{{labels},otelbpf_nccl_state="{state}"}}',
                    "values": f"0+{value}x{STEPS}"})  # fmt: skip
        out.append({"series": f'otelbpf_nccl_time_seconds_count{{{labels},otelbpf_nccl_state="{state}"}}',
                    "values": f"0+1x{STEPS}"})  # fmt: skip
    return out


def ras_series(rank: int, behind_share: float, comm: str = COMM) -> list[dict]:
    labels = f'otelbpf_nccl_comm_hash="{comm}",otelbpf_nccl_rank="{rank}",host_name="{NODES[rank]}",job="otelbpf"'
    return [
        {"series": f"otelbpf_nccl_ras_replies_total{{{labels}}}", "values": f"0+10x{STEPS}"},
        {"series": f"otelbpf_nccl_ras_rank_behind_total{{{labels}}}", "values": f"0+{behind_share * 10}x{STEPS}"},
    ]


def normal(**changes) -> dict[str, float]:
    """A rank's seconds per collective: a 12 ms wait for a late peer, 2 ms of GPU wait, 0.2 ms on
    the CPU, 0.1 ms off it."""
    return {"collective": 0.012, "gpu_wait": 0.002, "on_cpu": 0.0002, "off_cpu": 0.0001, **changes}


def slow_rank_expectation(rank: int, kind: str, comm: str = COMM) -> dict:
    return {
        "labels": (f'otelbpf:nccl_slow_rank:info{{host_name="{NODES[rank]}",kind="{kind}",'
                   f'otelbpf_nccl_comm_hash="{comm}",otelbpf_nccl_rank="{rank}"}}'),  # fmt: skip
        "value": 1,
    }


def run_promtool(promtool: str, tmp_path, series: list[dict], expected: list[dict], alerts: list | None = None) -> None:
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": STEP,
            "input_series": series,
            "promql_expr_test": [{"expr": "otelbpf:nccl_slow_rank:info", "eval_time": "10m", "exp_samples": expected}],
            **({"alert_rule_test": alerts} if alerts is not None else {}),
        }],
    }  # fmt: skip
    path = tmp_path / "rules_test.yaml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_file_is_valid(promtool):
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_compute_slow_rank_is_named_with_its_node(promtool, tmp_path):
    """Rank 2 waits 11.5 ms longer for its GPU; the others wait for it inside the collective."""
    series = [s for r in (0, 1, 3) for s in rank_series(r, normal())]
    series += rank_series(2, normal(collective=0.0005, gpu_wait=0.0135))
    alerts = [{
        "eval_time": "10m", "alertname": "NcclSlowRank",
        "exp_alerts": [{"exp_labels": {"severity": "warning", "kind": "compute", "otelbpf_nccl_comm_hash": COMM,
                                       "otelbpf_nccl_rank": "2", "host_name": "node-b"},
                        "exp_annotations": {
                            "summary": f"NCCL communicator {COMM}: rank 2 on node-b holds the others back (compute-slow)",
                            "description": (f"Rank 2 on node node-b arrives last at the collectives of communicator {COMM}:"
                                            " the other ranks wait for it. Its GPU work before each collective takes longer"
                                            " (it waits longer for its GPU). See docs/gpu.md \"Slow ranks across nodes\"."),
                        }}],
    }]  # fmt: skip
    run_promtool(promtool, tmp_path, series, [slow_rank_expectation(2, "compute")], alerts)


def test_a_host_slow_rank_is_named(promtool, tmp_path):
    """Rank 1's thread is busy 11.5 ms on the CPU before it launches."""
    series = [s for r in (0, 2, 3) for s in rank_series(r, normal())]
    series += rank_series(1, normal(collective=0.0005, on_cpu=0.0117))
    run_promtool(promtool, tmp_path, series, [slow_rank_expectation(1, "host")])


def test_a_rank_off_the_cpu_is_host_slow_too(promtool, tmp_path):
    """Rank 3 sleeps (off the CPU) before it launches; its agent has no off-CPU clock for the
    others (their host time unsplit): still host-slow."""
    series = [s for r in (0, 1, 2) for s in rank_series(r, {"collective": 0.012, "gpu_wait": 0.002, "host": 0.0003})]
    series += rank_series(3, normal(collective=0.0005, off_cpu=0.0116))
    run_promtool(promtool, tmp_path, series, [slow_rank_expectation(3, "host")])


def test_a_communication_slow_rank_is_named_from_nccls_counts(promtool, tmp_path):
    """Rank 0's collectives take longer once every rank entered: in lockstep every rank's wait is
    the same, so the waits name nobody; NCCL's RAS finds rank 0 behind in most replies, and its
    time between collectives is no longer than the others': communication-slow."""
    series = [s for r in range(4) for s in rank_series(r, normal(collective=0.011))]
    series += ras_series(0, 0.7) + [s for r in (1, 2, 3) for s in ras_series(r, 0.0)]
    run_promtool(promtool, tmp_path, series, [slow_rank_expectation(0, "communication")])


def test_no_rank_is_named_when_a_rank_is_not_measured(promtool, tmp_path):
    """Rank 2's agent came after the communicator's set-up and cannot name its collective
    instances: rank 1, which waits least of the three measured, must not be named."""
    series = [s for r in (0, 3) for s in rank_series(r, normal())]
    series += rank_series(1, normal(collective=0.0005))
    run_promtool(promtool, tmp_path, series, [])


def test_no_rank_is_named_from_the_ras_shares_of_some_ranks_only(promtool, tmp_path):
    """Node-b's agent came late and hears no RAS: ranks 2 and 3 are neither measured nor
    reported; of the ranks node-a's agent reports, rank 1 lags in most replies (rank 3, the
    slow one, lags in more): rank 1 must not be named."""
    series = rank_series(0, normal()) + rank_series(1, normal(collective=0.007, gpu_wait=0.007))
    series += ras_series(0, 0.1) + ras_series(1, 0.6)
    run_promtool(promtool, tmp_path, series, [])


def test_no_rank_is_named_when_the_ranks_are_balanced(promtool, tmp_path):
    series = [s for r in range(4) for s in rank_series(r, normal(collective=0.002 + r * 0.0001))]
    series += [s for r in range(4) for s in ras_series(r, 0.25)]
    run_promtool(promtool, tmp_path, series, [], alerts=[{"eval_time": "10m", "alertname": "NcclSlowRank", "exp_alerts": []}])


def test_two_communicators_are_judged_apart(promtool, tmp_path):
    other = "00000000000000ff"
    series = [s for r in (0, 1, 3) for s in rank_series(r, normal())]
    series += rank_series(2, normal(collective=0.0005, gpu_wait=0.0135))
    series += [s for r in (0, 2, 3) for s in rank_series(r, normal(), comm=other)]
    series += rank_series(1, normal(collective=0.0005, on_cpu=0.0117), comm=other)
    expected = [slow_rank_expectation(2, "compute"), slow_rank_expectation(1, "host", comm=other)]
    run_promtool(promtool, tmp_path, series, expected)


def test_ranks_with_no_collective_in_the_window_are_not_judged(promtool, tmp_path):
    """A communicator idle for the window (its counters flat: no mean, never NaN) is not named,
    even by a RAS reply that still finds a rank behind."""
    series = []
    for rank in range(4):
        for entry in rank_series(rank, normal()):
            entry["values"] = "1x60" if "time_seconds" in entry["series"] else entry["values"]
            series.append(entry)
    series += ras_series(0, 0.7) + [s for r in (1, 2, 3) for s in ras_series(r, 0.0)]
    run_promtool(promtool, tmp_path, series, [])
