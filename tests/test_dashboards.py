"""deploy/grafana and deploy/prometheus against the real thing: a REAL Prometheus (Debian's
package) scrapes `gpuvet watch --prometheus`, its NVML answering from a real capture (six GTX 1070
on x1 risers, GPUVET_NVML_REPLAY), and a REAL node_exporter whose textfile collector reads what
`gpuvet health --textfile` wrote from real faults (those risers, and a K40m's dmesg with Xid 79).
Prometheus loads gpuvet's alert rules; then every panel of gpuvet's dashboard, every panel of
NVIDIA's DCGM dashboard (grafana.com 12239, verbatim) and every alert is run against it.
Waiting is on what the servers answer, with deadlines, never a fixed sleep."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from test_exporter import _free_port, _prometheus, _query, _until

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuvet-dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "gpuvet-alerts.yml"
DCGM_DASHBOARD = FIXTURES / "grafana" / "dcgm-exporter-dashboard-12239.json"
RISERS = FIXTURES / "smi_xml" / "gtx-1070-x6-riser-pcie-x1-384.66-v9.xml"  # x1 links: gpu.pcie_link fails, ask_provider
XID79 = FIXTURES / "kernel_log" / "dmesg-tesla-k40m-aer-surprise-down-xid79-390.30.txt"  # reboot_node

# DCGM's profiling counters (DCGM_FI_PROF_*) come from the GPU's performance monitors through DCGM's
# profiling module; NVML has no call for them, so gpuvet cannot serve them. The 12239 dashboard's
# "Tensor Core Utilization" panel reads one; dcgm-exporter's default counters list these five.
NVML_CANNOT = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
               "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES")


def _node_exporter() -> str:
    path = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if path is None:
        if os.environ.get("GPUVET_NO_EXTERNAL_TOOLS") == "1":
            pytest.skip("node_exporter not installed and GPUVET_NO_EXTERNAL_TOOLS=1")
        pytest.fail("node_exporter is not installed: `apt-get install -y prometheus-node-exporter`")
    return path


def _get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]


class Stack:
    """gpuvet watch, node_exporter and Prometheus on loopback, each a child of the test process."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.children: list[subprocess.Popen] = []
        self.web_port = _free_port()
        self.log = folder / "prometheus.log"
        self.server: subprocess.Popen | None = None

    def _spawn(self, argv: list[str], env: dict | None = None, log: str = "child.log") -> subprocess.Popen:
        with open(self.folder / log, "w") as out:
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        self.children.append(child)
        return child

    def start(self) -> None:
        textfiles = self.folder / "textfile"
        textfiles.mkdir()
        done = subprocess.run([sys.executable, "-m", "gpuvet", "health", "--no-save", "--textfile", str(textfiles),
                               "--from", str(RISERS), "--from", str(XID79), "--brief"], check=False, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 1 and done.stdout.startswith("gpuvet: gpu.xid reboot_node"), done.stdout + done.stderr
        self.summary = done.stdout.strip()
        exporter_port, node_port = _free_port(), _free_port()
        self._spawn([sys.executable, "-m", "gpuvet", "watch", "--no-ui", "--interval", "1", "--prometheus",
                     f"127.0.0.1:{exporter_port}"], env={**os.environ, "GPUVET_NVML_REPLAY": str(RISERS)}, log="watch.log")
        self._spawn([_node_exporter(), f"--web.listen-address=127.0.0.1:{node_port}", "--collector.disable-defaults",
                     "--collector.textfile", f"--collector.textfile.directory={textfiles}"], log="node_exporter.log")
        rules = self.folder / "gpuvet-alerts.yml"
        rules.write_text(RULES.read_text())
        config = self.folder / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "gpuvet", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]},
                               {"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{node_port}"]}]}]}))
        self.server = self._spawn([_prometheus(), f"--config.file={config}", f"--storage.tsdb.path={self.folder / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{self.web_port}"], log="prometheus.log")
        self.until("both targets up", lambda: sorted(float(r["value"][1]) for r in self.query("up")) == [1.0, 1.0])
        self.until("the exporter's GPUs and the textfile's verdict",
                   lambda: len(self.query("DCGM_FI_DEV_GPU_TEMP")) == 6 and self.query("gpuvet_health_action_rank"))

    def query(self, promql: str) -> list[dict]:
        return _query(self.web_port, promql)

    def until(self, what: str, fn) -> object:
        assert self.server is not None
        return _until(what, fn, self.server, self.log)

    def __enter__(self) -> "Stack":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for child in reversed(self.children):
            child.terminate()
        for child in reversed(self.children):
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with Stack(tmp_path_factory.mktemp("prometheus")) as running:
        yield running


def _targets(dashboard: dict) -> list[tuple[str, str]]:
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            found += [(inner["title"], t["expr"]) for t in inner.get("targets", []) if t.get("expr")]
    return found


def _with_all(expr: str) -> str:
    """A panel's query as Grafana sends it with every value of every variable chosen."""
    return re.sub(r"\$\{?(node|instance|gpu)\}?", ".+", expr)


def test_the_alert_rules_pass_promtool():
    promtool = shutil.which("promtool") or pytest.fail("promtool is not installed (Debian's prometheus package)")
    done = subprocess.run([promtool, "check", "rules", str(RULES)], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_panel_of_gpuvets_dashboard_returns_data(stack):
    dashboard = json.loads(DASHBOARD.read_text())
    targets = _targets(dashboard)
    assert len(targets) >= 12
    empty = [(title, expr) for title, expr in targets if not stack.query(_with_all(expr))]
    assert empty == []
    # The node variable lists the node the textfile came from.
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "node"]
    metric = re.match(r"label_values\((\w+), *instance\)", variable["definition"]).group(1)
    values = _get(stack.web_port, "/api/v1/label/instance/values?" + urllib.parse.urlencode({"match[]": metric}))
    assert values and all(re.match(variable["regex"].strip("/"), v) for v in values)


def test_the_dashboard_shows_the_action_and_the_failing_gpus(stack):
    (rank,) = stack.query('max by (instance) (gpuvet_health_action_rank{instance=~".+(:[0-9]+)?"})')
    assert rank["value"][1] == "6"  # reboot_node: the Xid 79
    failing = stack.query("gpuvet_health_check_ok == 0")
    assert {(r["metric"]["check"], r["metric"]["action"]) for r in failing} >= {("gpu.xid", "reboot_node"),
                                                                              ("gpu.pcie_link", "ask_provider")}
    assert sorted(r["metric"]["gpu"] for r in failing if r["metric"]["check"] == "gpu.pcie_link") == [str(i) for i in range(6)]
    (info,) = stack.query("gpuvet_health_info")
    assert info["metric"]["summary"] == stack.summary


def test_every_alert_is_loaded_and_the_remediation_alert_fires_with_its_action(stack):
    groups = _get(stack.web_port, "/api/v1/rules")["groups"]
    rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
    shipped = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    assert sorted(rules) == sorted(r["alert"] for r in shipped)
    firing = stack.until("GpuvetNodeNeedsRemediation firing", lambda: [
        a for a in _get(stack.web_port, "/api/v1/alerts")["alerts"]
        if a["labels"]["alertname"] == "GpuvetNodeNeedsRemediation" and a["state"] == "firing"])
    (alert,) = firing
    assert alert["labels"]["action"] == "reboot_node" and alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["description"] == stack.summary  # the summary line, looked up by the template
    assert all(rule["health"] == "ok" for rule in rules.values()), {n: r.get("lastError") for n, r in rules.items()}


@pytest.mark.parametrize("alert", [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]])
def test_each_alert_reads_series_that_exist(stack, alert):
    """An alert that does not fire here still reads only series gpuvet serves (a misspelt name
    would never fire anywhere); those that must fire in this scene return data."""
    (rule,) = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r["alert"] == alert]
    names = set(re.findall(r"\b((?:gpuvet|DCGM)_[A-Za-z0-9_]+)", rule["expr"]))
    assert names
    for name in names:
        assert stack.query(name), f"{alert}: {name} has no series"
    fires_here = {"GpuvetNodeNeedsRemediation", "GpuvetGpuFailing"}
    assert bool(stack.query(rule["expr"])) == (alert in fires_here)


def test_nvidias_dcgm_dashboard_works_unchanged_but_for_profiling_counters(stack):
    dashboard = json.loads(DCGM_DASHBOARD.read_text())
    assert dashboard["gnetId"] == 12239
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            metric, label = re.match(r"label_values\((\w+), *(\w+)\)", variable["query"]).groups()
            values = _get(stack.web_port, f"/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": metric}))
            assert values, variable["name"]
    empty = [title for title, expr in _targets(dashboard) if not stack.query(_with_all(expr))]
    profiling = [title for title, expr in _targets(dashboard) if any(name in expr for name in NVML_CANNOT)]
    assert empty == profiling == ["Tensor Core Utilization"]
