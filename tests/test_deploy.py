"""deploy/: the Kubernetes manifests validate against Kubernetes' own schemas (kubernetes-validate,
offline), node-problem-detector's plugin config holds to its protocol, the Job's commands exist,
node labels are valid label values, and labelling talks to the API server as it expects."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuvet.fleet import kubernetes
from gpuvet import judge
from gpuvet.probe import capture
from gpuvet.record import RunRecord
from gpuvet.report.health import SUMMARY_MAX
from gpuvet.report.node_labels import node_labels

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSION = "1.30.0"  # the oldest schema set kubernetes-validate's floor (1.30) carries
FIXTURES = ROOT / "tests" / "fixtures"
HEALTHY = FIXTURES / "smi_text" / "q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # Kubernetes' label value syntax


def _documents() -> list[tuple[str, dict]]:
    return [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
            for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kind(kind: str) -> dict:
    return next(doc for _, doc in _documents() if doc["kind"] == kind)


def test_every_manifest_validates_against_the_kubernetes_schemas():
    kinds = set()
    for name, doc in _documents():
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{name}: {err.message} at {'.'.join(str(p) for p in err.path)}")
        kinds.add(doc["kind"])
    assert {"DaemonSet", "Job", "ConfigMap", "ClusterRoleBinding"} <= kinds


def test_a_broken_manifest_is_refused():
    daemonset = json.loads(json.dumps(_kind("DaemonSet")))
    daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readonly"] = True  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def _plugin_config() -> dict:
    return json.loads(_kind("ConfigMap")["data"]["gpuvet-health.json"])


def test_the_plugin_config_holds_to_node_problem_detectors_protocol():
    """What NPD's config.go checks: plugin "custom", no rule timeout over the global one, a default
    condition for each permanent rule; and room for gpuvet's whole summary line."""
    config = _plugin_config()
    assert config["plugin"] == "custom"
    seconds = {rule["timeout"] for rule in config["rules"]} | {config["pluginConfig"]["timeout"]}
    assert all(re.fullmatch(r"\d+s", s) for s in seconds)
    assert max(int(s[:-1]) for s in seconds) == int(config["pluginConfig"]["timeout"][:-1]) > 5  # gpuvet's budget is 5 s
    conditions = {c["type"] for c in config["conditions"]}
    assert all(r["condition"] in conditions for r in config["rules"] if r["type"] == "permanent")
    assert config["pluginConfig"]["max_output_length"] >= SUMMARY_MAX
    daemonset = _kind("DaemonSet")["spec"]["template"]["spec"]
    assert any("--config.custom-plugin-monitor=/config/gpuvet-health.json" == a for a in daemonset["containers"][0]["args"])


def test_the_plugins_command_runs_and_fits_the_output_limit():
    rule = _plugin_config()["rules"][0]
    assert Path(rule["path"]).name == "gpuvet"
    done = subprocess.run([sys.executable, "-m", "gpuvet", *rule["args"], "--no-save", "--from", str(HEALTHY)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and len(done.stdout.strip().encode()) <= _plugin_config()["pluginConfig"]["max_output_length"]


def test_the_jobs_commands_exist():
    script = _kind("Job")["spec"]["template"]["spec"]["containers"][0]["args"][0]
    for command in re.findall(r"gpuvet ([a-z-]+)", script):
        done = subprocess.run([sys.executable, "-m", "gpuvet", command, "--help"], check=False, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, f"gpuvet {command}: {done.stderr}"


def test_the_image_brings_no_driver():
    """The node's driver is mounted in by the NVIDIA container toolkit; one in the image would
    mismatch the node's kernel module (NVML: driver/library version mismatch)."""
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    steps = [line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    assert not [s for s in steps if re.search(r"nvidia-driver|libnvidia|cuda-drivers|nvidia-utils", s)]
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in dockerfile


@pytest.mark.parametrize("fixture", ["smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt",
                                     "smi_xml/gtx-1660-ti-graphics-device-418.43.xml",
                                     "smi_xml/rtx-3080-windows-wddm-536.40-v12.xml",
                                     "smi_xml/tesla-k80-x4-azure-ecc-retired-430.26-v10.xml"])
def test_node_labels_are_valid_label_values(fixture):
    machine = capture.merge(capture.read_captures(str(FIXTURES / fixture)))
    labels = node_labels(RunRecord(machine=machine, started_at="2026-12-01T23:16:55Z", options={"profile": "health"}))
    assert all(LABEL_VALUE.match(v) and len(v) <= 63 for v in labels.values()), labels
    assert labels["gpuvet.dev/kind"] == "health" and labels["gpuvet.dev/checked-at"] == "2026-12-01T23-16-55Z"
    if "h100" in fixture:
        assert labels["gpuvet.dev/model"] == "NVIDIA-H100-80GB-HBM3" and labels["gpuvet.dev/power-cap-w"] == "700"


def test_node_labels_carry_the_action_a_remediator_takes():
    # The H100 report's gpu2 is power-braked: a limit outside the machine, the provider's to lift.
    machine = capture.merge(capture.read_captures(str(FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt")))
    record = RunRecord(machine=machine, started_at="2026-12-01T23:16:55Z", options={"profile": "quick"},
                       findings=judge.judge(machine))
    labels = node_labels(record)
    assert labels["gpuvet.dev/verdict"] == "fail" and labels["gpuvet.dev/action"] == "ask_provider"


class _ApiServer(BaseHTTPRequestHandler):
    """A stand-in for the API server's node endpoint: records the request, answers like it."""

    seen: list[dict] = []
    refuse = False

    def do_PATCH(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append({"path": self.path, "type": self.headers["Content-Type"],
                          "auth": self.headers["Authorization"], "body": json.loads(body)})
        status, answer = (403, {"kind": "Status", "message": 'nodes "n1" is forbidden'}) if self.refuse else (200, {})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(answer).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def api_server():
    _ApiServer.seen, _ApiServer.refuse = [], False
    server = HTTPServer(("127.0.0.1", 0), _ApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield kubernetes.ApiServer(f"http://127.0.0.1:{server.server_port}", "tok", None)
    server.shutdown()
    server.server_close()


def test_labelling_sends_one_merge_patch_with_the_service_account(api_server):
    kubernetes.label_node(api_server, "n1", {"gpuvet.dev/verdict": "pass"})
    assert _ApiServer.seen == [{"path": "/api/v1/nodes/n1", "type": "application/merge-patch+json", "auth": "Bearer tok",
                                "body": {"metadata": {"labels": {"gpuvet.dev/verdict": "pass"}}}}]


def test_a_refused_label_is_one_line_with_the_servers_reason(api_server):
    _ApiServer.refuse = True
    with pytest.raises(kubernetes.KubernetesError, match='HTTP 403 nodes "n1" is forbidden'):
        kubernetes.label_node(api_server, "n1", {"gpuvet.dev/verdict": "pass"})
