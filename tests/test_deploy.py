"""The deployment files: Kubernetes manifests validated against the
Kubernetes API schemas (kubernetes-validate), the Helm chart's values against
its values.schema.json, and the pieces that must agree with each other (the
agent's flags, the Collector's endpoint and configuration).

What validates what: `kubernetes-validate` checks deploy/daemonset.yaml (the
chart's default rendering) and deploy/collector.yaml, strictly, for the
oldest and newest Kubernetes versions it knows. The chart's templates are
Helm (Go) templates and `helm` cannot be installed here: they are rendered with
Go's own text/template engine by deploy/helm/render/main.go (stand-ins for the
Sprig functions the chart calls), for the defaults and the other modes, and
the core-kind results validated the same way; the plain DaemonSet must equal
the default rendering. They are also checked for consistency with values.yaml
and the CLI; `make chart-check` runs `helm lint` and
`helm template | kubernetes-validate` where helm exists.
"""

from __future__ import annotations

import json
import re
import shlex

import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import ROOT
from otelbpf.cli.main import build_parser

DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "otelbpf"
K8S_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


def documents(path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kind(docs: list[dict], name: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == name]
    return found


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("manifest", ["daemonset.yaml", "collector.yaml"])
def test_manifests_validate_against_the_kubernetes_schemas(manifest, version):
    docs = documents(DEPLOY / manifest)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_kubernetes_validate_rejects_a_broken_manifest():
    """The check above can fail: a misplaced field is an error."""
    daemonset = kind(documents(DEPLOY / "daemonset.yaml"), "DaemonSet")
    daemonset["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = {"bad": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, K8S_VERSIONS[-1], strict=True)


# --- the agent's DaemonSet ------------------------------------------------------------


def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def test_daemonset_is_deployable_as_the_issue_asked():
    docs = documents(DEPLOY / "daemonset.yaml")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    account = kind(docs, "ServiceAccount")
    pod = kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    assert account["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert pod["hostPID"] is True
    assert pod["nodeSelector"]["kubernetes.io/os"] == "linux"
    repository, tag = agent["image"].rsplit(":", 1)
    assert "/" in repository and "." in repository.split("/")[0], "image names a registry"
    assert tag == chart["appVersion"] and tag != "latest"
    health = values()["healthPort"]
    assert agent["ports"] == [{"name": "health", "containerPort": health, "protocol": "TCP"}]
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert agent["args"][agent["args"].index("--health-port") + 1] == str(health)
    assert {"configMapRef": {"name": "otelbpf"}} in agent["envFrom"]
    assert any(e["name"] == "K8S_NODE_NAME" for e in agent["env"])


def test_daemonset_arguments_are_accepted_by_the_agent():
    agent = kind(documents(DEPLOY / "daemonset.yaml"), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(agent["args"])
    assert args.command == "run" and args.all and args.health_port == values()["healthPort"]


def test_daemonset_endpoint_is_the_collector_service():
    config = kind(documents(DEPLOY / "daemonset.yaml"), "ConfigMap")["data"]
    assert config["OTEL_EXPORTER_OTLP_ENDPOINT"] == values()["otlp"]["endpoint"]
    collector = documents(DEPLOY / "collector.yaml")
    service = kind(collector, "Service")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}"
    ports = {p["port"] for p in service["spec"]["ports"]}
    assert config["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{host}:4317" and 4317 in ports


# --- the Helm chart ---------------------------------------------------------------------


def schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())


def test_chart_values_match_their_schema():
    jsonschema.Draft7Validator.check_schema(schema())
    jsonschema.validate(values(), schema())


@pytest.mark.parametrize(
    "change",
    [
        {"otlp": {"endpoint": "otel-collector:4317", "protocol": "grpc"}},  # no scheme
        {"otlp": {"endpoint": "http://c:4317", "protocol": "json"}},
        {"trace": {"mode": "comm", "comms": []}},
        {"trace": {"mode": "namespaces"}},
        {"capture": {"bytes": 16}},
        {"capture": {"ringBufferMB": 3}},
        {"exclude": {"comms": ["otelcol*x"]}},
        {"securityMode": "root"},
        {"capabilities": ["SYS_EVERYTHING"]},
        {"healthPort": 0},
        {"propagation": {"mode": "ip"}},  # OBI's IP options: removed there, never here
        {"propagation": {"mode": "tcp", "cgroupPath": "sys/fs/cgroup"}},
        {"replicas": 2},  # unknown key: a typo is an error, not ignored
    ],
)
def test_chart_schema_rejects_bad_values(change):
    bad = {**values(), **change}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema())


def defined(tree: dict, path: list[str]) -> bool:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return True


def test_every_value_the_templates_use_is_defined_and_in_the_schema():
    used = set()
    for template in (CHART / "templates").rglob("*"):
        if template.is_file():
            used |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()))
    assert used
    properties = schema()["properties"]
    for path in sorted(used):
        keys = path.split(".")
        assert defined(values(), keys), f".Values.{path} is not in values.yaml"
        assert keys[0] in properties, f"{keys[0]} is not in values.schema.json"


def test_every_flag_the_chart_passes_exists():
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    flags = set(re.findall(r"^- (--[a-z-]+)$", helpers, re.M))
    assert "--health-port" in flags and "--exclude-comm" in flags
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    known = {option for action in run._actions for option in action.option_strings}
    assert flags <= known, flags - known


def test_chart_capability_mode_has_what_doctor_asks_for():
    """doctor's process-identity check names SYS_PTRACE and DAC_READ_SEARCH (otelbpf.cli.doctor)."""
    from otelbpf.cli.doctor import IDENTITY_READS

    assert {capability for _, _, capability in IDENTITY_READS} <= set(values()["capabilities"])
    assert {"BPF", "PERFMON"} <= set(values()["capabilities"])


# --- the Collector ------------------------------------------------------------------------


def pipelines_resolve(config: dict) -> None:
    for name, pipeline in config["service"]["pipelines"].items():
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section, []):
                assert component in config[section], f"{name}: {section} {component} is not defined"
    assert config["service"]["extensions"] == ["health_check"] and "health_check" in config["extensions"]


@pytest.mark.parametrize("name", ["otelbpf-k8s.yaml", "otelbpf-to-jaeger.yaml"])
def test_collector_configs_use_current_component_names(name):
    config = yaml.safe_load((ROOT / "collector-config" / name).read_text())
    pipelines_resolve(config)
    exporters = {e.split("/")[0] for e in config["exporters"]}
    assert not exporters & {"otlp", "otlphttp"}, "deprecated names since Collector v0.144"
    assert "k8sattributes" not in {p.split("/")[0] for p in config.get("processors", {})}


def test_collector_manifest_carries_the_k8s_config_and_rbac():
    docs = documents(DEPLOY / "collector.yaml")
    embedded = yaml.safe_load(kind(docs, "ConfigMap")["data"]["config.yaml"])
    assert embedded == yaml.safe_load((ROOT / "collector-config" / "otelbpf-k8s.yaml").read_text())
    rules = kind(docs, "ClusterRole")["rules"]
    granted = {(group, resource) for rule in rules for group in rule["apiGroups"] for resource in rule["resources"]}
    assert {("", "pods"), ("", "namespaces"), ("apps", "replicasets")} <= granted
    binding = kind(docs, "ClusterRoleBinding")
    pod = kind(docs, "Deployment")["spec"]["template"]["spec"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"] == kind(docs, "ServiceAccount")["metadata"]["name"]
    collector = pod["containers"][0]
    assert collector["readinessProbe"]["httpGet"]["port"] == "health"
    assert {"name": "health", "containerPort": 13133, "protocol": "TCP"} in collector["ports"]
    assert shlex.split(collector["args"][0])[0].endswith("/conf/config.yaml")


# --- the chart rendered with Go's template engine (deploy/helm/render) -------------------


def render_chart(overrides: dict | None = None) -> list[dict]:
    """The chart's manifests, rendered by deploy/helm/render/main.go with values.yaml
    (deep-merged with ``overrides``) as `helm template otelbpf -n otelbpf` would."""
    import shutil
    import subprocess

    go = shutil.which("go")
    assert go, "go is needed to render the chart (scripts/install.sh installs golang-go)"
    merged = values()

    def merge(base: dict, extra: dict) -> None:
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = value

    merge(merged, overrides or {})
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    data = {
        "Values": merged,
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart.get("appVersion", "")},
        "Release": {"Name": "otelbpf", "Namespace": "otelbpf", "Service": "Helm"},
    }
    result = subprocess.run(
        [go, "run", str(DEPLOY / "helm" / "render" / "main.go"), str(CHART)],
        input=json.dumps(data), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


#: Kinds the Kubernetes schemas know; a ServiceMonitor is a Prometheus Operator CRD.
CORE_KINDS = {"ConfigMap", "DaemonSet", "ServiceAccount", "Service", "Pod"}

RENDER_CASES = {
    "defaults": {},
    "propagation off": {"propagation": {"mode": "off"}},
    "propagation on a hybrid host": {"propagation": {"mode": "all", "cgroupPath": "/sys/fs/cgroup/unified"}},
    "capabilities": {"securityMode": "capabilities"},
    "metrics and ServiceMonitor": {"metrics": {"enabled": True, "serviceMonitor": {"enabled": True}}},
    "metrics and PodMonitor": {"metrics": {"enabled": True, "podMonitor": {"enabled": True}}},
    "no metrics": {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
}


@pytest.mark.parametrize("case", sorted(RENDER_CASES))
def test_the_chart_renders_to_valid_manifests(case):
    docs = render_chart(RENDER_CASES[case])
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "ConfigMap", "ServiceAccount"} <= kinds
    for doc in docs:
        if doc["kind"] in CORE_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
    if case == "metrics and ServiceMonitor":
        assert {"Service", "ServiceMonitor"} <= kinds
    if case == "metrics and PodMonitor":
        assert "PodMonitor" in kinds
    if case == "no metrics":
        assert not {"Service", "ServiceMonitor", "PodMonitor"} & kinds
    daemonset = kind(docs, "DaemonSet")
    agent = daemonset["spec"]["template"]["spec"]["containers"][0]
    security = agent["securityContext"]
    if case == "capabilities":
        assert not security.get("privileged") and "BPF" in security["capabilities"]["add"]
    else:
        assert security["privileged"] is True
    pod = daemonset["spec"]["template"]["spec"]
    args = build_parser().parse_args(agent["args"])
    host_cgroup = [v for v in pod["volumes"] if v["name"] == "host-cgroup"]
    mode = (RENDER_CASES[case].get("propagation") or {}).get("mode", "tcp")
    assert args.propagation == mode
    if mode == "off":  # nothing of the node's cgroups is mounted
        assert not host_cgroup and args.propagation_cgroup is None
    else:  # the sock_ops program goes on the node's cgroup v2 hierarchy, mounted read-only
        path = (RENDER_CASES[case].get("propagation") or {}).get("cgroupPath", "/sys/fs/cgroup")
        assert host_cgroup == [{"name": "host-cgroup", "hostPath": {"path": path}}]
        mount = next(m for m in agent["volumeMounts"] if m["name"] == "host-cgroup")
        assert mount == {"name": "host-cgroup", "mountPath": args.propagation_cgroup, "readOnly": True}


def test_the_plain_daemonset_is_the_charts_default_rendering():
    """deploy/daemonset.yaml (for kubectl apply) says what the chart's defaults render,
    but for the chart's own bookkeeping (helm labels, the config checksum)."""
    rendered = render_chart()

    def comparable(doc: dict) -> dict:
        doc = json.loads(json.dumps(doc))
        doc["metadata"].get("labels", {}).pop("helm.sh/chart", None)
        doc["metadata"].get("labels", {}).pop("app.kubernetes.io/managed-by", None)
        if doc["kind"] == "DaemonSet":
            template_meta = doc["spec"]["template"]["metadata"]
            template_meta.get("annotations", {}).pop("checksum/config", None)
            if not template_meta.get("annotations", True):
                del template_meta["annotations"]
        return doc

    plain = {(d["kind"], d["metadata"]["name"]): comparable(d) for d in documents(DEPLOY / "daemonset.yaml")}
    for doc in rendered:
        key = (doc["kind"], doc["metadata"]["name"])
        if key in plain:
            assert comparable(doc) == plain[key], key
    assert ("DaemonSet", "otelbpf") in plain


def _fake_tools(bin_dir, **tools: int) -> dict[str, str]:
    """Executables named after ``tools`` in ``bin_dir``, each exiting with its code; PATH holds only them."""
    bin_dir.mkdir(exist_ok=True)
    for name, code in tools.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\nexit {code}\n")
        tool.chmod(0o755)
    return {"PATH": str(bin_dir)}


@pytest.mark.parametrize(
    "tools, engine",
    [
        ({"docker": 1}, None),  # a docker client whose daemon does not answer is no engine
        ({"docker": 0}, "docker"),
        ({"podman": 0, "docker": 0}, "podman"),
        ({}, None),
    ],
)
def test_a_container_engine_is_one_that_answers(tmp_path, tools, engine):
    """scripts/container_engine.sh (make image, image_smoke.sh): image_smoke.sh installs podman
    whenever it says there is none, so a docker client without a daemon no longer stops it."""
    import subprocess

    done = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "container_engine.sh")], env=_fake_tools(tmp_path / "bin", **tools),
                          capture_output=True, text=True)  # fmt: skip
    if engine is None:
        assert done.returncode != 0 and "no container engine: install podman" in done.stderr, done
    else:
        assert done.returncode == 0 and done.stdout.strip() == engine, done
    smoke = (ROOT / "scripts" / "image_smoke.sh").read_text()
    assert 'container_engine.sh" >/dev/null 2>&1 || apt-get install -y -q podman' in smoke


@pytest.mark.parametrize("case", sorted(RENDER_CASES))
def test_prometheus_scrapes_every_metric_where_the_chart_says(case):
    """With metrics.enabled the agent serves every metric (--prometheus-port) on the health
    port, and the annotations, the Service, the ServiceMonitor and the PodMonitor all point
    there; without it, none of them and no flag."""
    docs = render_chart(RENDER_CASES[case])
    enabled = values()["metrics"]["enabled"] if "metrics" not in RENDER_CASES[case] else RENDER_CASES[case]["metrics"]["enabled"]
    template = kind(docs, "DaemonSet")["spec"]["template"]
    agent = template["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    args = agent["args"]
    annotations = template["metadata"].get("annotations", {})
    if not enabled:
        assert "--prometheus-port" not in args and "prometheus.io/scrape" not in annotations
        return
    port = args[args.index("--prometheus-port") + 1]
    assert port == args[args.index("--health-port") + 1] == str(ports["health"])
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == port
    assert annotations["prometheus.io/path"] == "/metrics"
    service = kind(docs, "Service")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["targetPort"] == "health"
    selector = service["spec"]["selector"]
    assert selector.items() <= template["metadata"]["labels"].items()
    for monitor in (d for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")):
        (endpoint,) = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] == "health" and endpoint["path"] == "/metrics"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


# --- Prometheus rules and the Grafana dashboard -------------------------------------------

DASHBOARD = DEPLOY / "grafana" / "otelbpf-nccl-ranks.json"
RULES = DEPLOY / "prometheus" / "otelbpf-rules.yaml"


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the shipped dashboard, its variables filled in."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"].replace("$communicator", ".*") for p in dashboard["panels"] for t in p.get("targets", [])]


def test_the_dashboard_is_one_grafana_can_import():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "communicator"} <= variables
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"]
        for target in panel["targets"]:
            assert set(re.findall(r"\$(\w+)", target["expr"])) <= variables, target["expr"]
    cells = set()  # panels never overlap on the 24-column grid
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, panel["title"]
        cells |= area


def test_the_dashboards_queries_parse_and_read_what_exists(tmp_path):
    """promtool parses each query (as a recording rule), and each series it reads is recorded by
    the shipped rules or is one of the agent's metrics (a name of otelbpf/semconv.py, as
    otelbpf/metrics/prometheus.py renders it, with a unit or kind suffix; tests/test_ebpf_ranks.py
    runs every query against real agents and finds data)."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package; scripts/install.sh installs it)")
    queries = dashboard_queries()
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": q} for i, q in enumerate(queries)]}]}
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run([promtool, "check", "rules", str(tmp_path / "dashboard.yaml")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shipped = yaml.safe_load(RULES.read_text())
    recorded = {r["record"] for g in shipped["groups"] for r in g["rules"] if "record" in r}
    from otelbpf import semconv
    from otelbpf.metrics.prometheus import label_name

    agents = {label_name(v) for k, v in vars(semconv).items() if k.startswith("OTELBPF_") and isinstance(v, str)}
    suffixes = ("", "_seconds", "_bytes", "_total", "_ratio", "_count", "_sum", "_bucket", "_seconds_count", "_seconds_sum")
    names = re.compile(r"\b(otelbpf(?::|_)[a-z0-9_:]+)\b(?!\s*[,)=!~])")  # a metric, not a label
    for query in queries:
        for name in names.findall(query):
            assert name in recorded or any(name.removesuffix(x) in agents for x in suffixes if name.endswith(x)), name


def test_the_rules_check_with_promtool():
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package; scripts/install.sh installs it)")
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
