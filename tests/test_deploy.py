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

from cli_runner import gpuvet
from gpuvet.fleet import kubernetes
from gpuvet import judge
from gpuvet.probe import capture
from gpuvet.record import RunRecord
from gpuvet.report.health import SUMMARY_MAX
from gpuvet.report.node_labels import node_labels

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSION = "1.30.0"  # the oldest Kubernetes still served (the manifests must work there too)
DRA_VERSION = "1.34.0"  # resource.k8s.io/v1 (Dynamic Resource Allocation) is served from 1.34
LATEST_VERSION = "1.37.0"  # the newest (kubernetes-validate's floor, 1.37, carries 1.30-1.37): nothing shipped uses a removed API
FIXTURES = ROOT / "tests" / "fixtures"
HEALTHY = FIXTURES / "smi_text" / "q-8x-a100-sxm4-40gb-azure-ndv4-460.32.03.txt"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # Kubernetes' label value syntax


def _documents() -> list[tuple[str, dict]]:
    return [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
            for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kind(kind: str, file: str = "") -> dict:
    """The first `kind` in deploy/kubernetes (in `file` when given: several files hold a DaemonSet or a Job)."""
    return next(doc for name, doc in _documents() if doc["kind"] == kind and name.startswith(file))


def _oldest_version(doc: dict) -> str:
    """The oldest Kubernetes that serves the document's API (a DRA file's pods name claims too)."""
    return DRA_VERSION if "resourceClaims" in json.dumps(doc) or doc["apiVersion"].startswith("resource.k8s.io/") \
        else KUBERNETES_VERSION


def test_every_manifest_validates_against_the_kubernetes_schemas():
    kinds = set()
    for name, doc in _documents():
        for version in (_oldest_version(doc), LATEST_VERSION):
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{name} (Kubernetes {version}): {err.message} at {'.'.join(str(p) for p in err.path)}")
        kinds.add(doc["kind"])
    assert {"DaemonSet", "Job", "ConfigMap", "ClusterRoleBinding", "ResourceClaimTemplate", "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"} <= kinds


def test_a_broken_manifest_is_refused():
    daemonset = json.loads(json.dumps(_kind("DaemonSet", "node-problem-detector-gpuvet.yaml")))
    daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readonly"] = True  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def _plugin_config() -> dict:
    return json.loads(_kind("ConfigMap", "node-problem-detector-gpuvet.yaml")["data"]["gpuvet-health.json"])


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
    daemonset = _kind("DaemonSet", "node-problem-detector-gpuvet.yaml")["spec"]["template"]["spec"]
    assert any("--config.custom-plugin-monitor=/config/gpuvet-health.json" == a for a in daemonset["containers"][0]["args"])


def test_the_plugins_command_runs_and_fits_the_output_limit(tmp_path):
    rule = _plugin_config()["rules"][0]
    assert Path(rule["path"]).name == "gpuvet"
    # The textfile folder is the DaemonSet's hostPath mount; here a folder of the test's own.
    daemonset = _kind("DaemonSet", "node-problem-detector-gpuvet.yaml")["spec"]["template"]["spec"]
    folder = rule["args"][rule["args"].index("--textfile") + 1]
    mounts = {m["mountPath"]: m["name"] for m in daemonset["containers"][0]["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in daemonset["volumes"] if "hostPath" in v}
    assert host[mounts[folder]] == "/var/lib/node_exporter/textfile_collector"
    args = [str(tmp_path) if a == folder else a for a in rule["args"]]
    done = subprocess.run([sys.executable, "-m", "gpuvet", *args, "--no-save", "--from", str(HEALTHY)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and len(done.stdout.strip().encode()) <= _plugin_config()["pluginConfig"]["max_output_length"]
    assert 'gpuvet_health_status{status="healthy"} 1.0' in (tmp_path / "gpuvet.prom").read_text()


@pytest.mark.parametrize("file", ["gpuvet-run-job.yaml", "gpuvet-run-job-dra.yaml"])
def test_the_jobs_commands_exist(file):
    script = _kind("Job", file)["spec"]["template"]["spec"]["containers"][0]["args"][0]
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
    """A stand-in for the API server's node endpoint (no kube-apiserver runs here): records each
    request and answers like it, applying a JSON patch's test and add/replace to its one node as
    the API server does (a failed test is HTTP 422, the node unchanged)."""

    seen: list[dict] = []
    refuse = False
    node: dict = {}
    changed_under_us = 0  # how many patches another writer beats gpuvet to (resourceVersion moves on)

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append({"method": "GET", "path": self.path})
        self._answer(200, self.node)

    def do_PATCH(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"path": self.path, "type": self.headers["Content-Type"],
                          "auth": self.headers["Authorization"], "body": body})
        if self.refuse:
            return self._answer(403, {"kind": "Status", "message": 'nodes "n1" is forbidden'})
        if self.headers["Content-Type"] == "application/json-patch+json":
            if _ApiServer.changed_under_us:
                _ApiServer.changed_under_us -= 1
                self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
            for op in body:
                if op["op"] == "test" and self.node["metadata"]["resourceVersion"] != op["value"]:
                    return self._answer(422, {"kind": "Status", "message": "the server rejected our request due to an "
                                              "error in our request: testing value /metadata/resourceVersion failed: test failed"})
            for op in body:
                if op["op"] in ("add", "replace") and op["path"] == "/spec/taints":
                    self.node.setdefault("spec", {})["taints"] = op["value"]
            self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
        self._answer(200, self.node)

    def _answer(self, status: int, answer: dict) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(answer).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def api_server():
    _ApiServer.seen, _ApiServer.refuse, _ApiServer.changed_under_us = [], False, 0
    _ApiServer.node = {"metadata": {"name": "n1", "resourceVersion": "100"},
                       "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}}
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


# -- the opt-in taint: the worst action on the node itself ------------------------------------------

XID79_ON_GPU3 = FIXTURES / "edited" / "dmesg-tesla-k40m-xid79-390.30-edited-bus-86-as-h100-gpu3.txt"
POWER_BRAKE = FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"


def _taints() -> list[tuple[str, str, str]]:
    return [(t["key"], t["value"], t["effect"]) for t in _ApiServer.node["spec"]["taints"]]


def _health_tainting(capsys, monkeypatch, api, *captures: Path, taint: str = "reset_gpu") -> tuple[int, str]:
    monkeypatch.setattr(kubernetes, "in_cluster", lambda: api)
    monkeypatch.setenv("NODE_NAME", "n1")
    monkeypatch.setenv("GPUVET_TAINT", taint)  # as the DaemonSet sets it
    code, _, err = gpuvet(capsys, "health", "--no-save", "--brief", *[a for c in captures for a in ("--from", str(c))])
    return code, err


def test_a_node_needing_a_reboot_is_tainted_with_the_action_and_untainted_once_healthy(capsys, monkeypatch, api_server):
    code, err = _health_tainting(capsys, monkeypatch, api_server, POWER_BRAKE, XID79_ON_GPU3)
    assert code == 1 and "tainted node n1 gpuvet.dev/action=reboot_node:NoSchedule" in err
    # The device plugin's taint is kept: the patch tested the version it read, then replaced the list.
    assert _taints() == [("nvidia.com/gpu", "present", "NoSchedule"), ("gpuvet.dev/action", "reboot_node", "NoSchedule")]
    patch = _ApiServer.seen[-1]
    assert patch["type"] == "application/json-patch+json"
    assert patch["body"][0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "100"}

    code, err = _health_tainting(capsys, monkeypatch, api_server, POWER_BRAKE, XID79_ON_GPU3)  # idempotent
    assert code == 1 and "already tainted" in err and _ApiServer.seen[-1]["method"] == "GET"

    code, err = _health_tainting(capsys, monkeypatch, api_server, HEALTHY)
    assert code == 0 and "took the gpuvet.dev/action taint off node n1" in err
    assert _taints() == [("nvidia.com/gpu", "present", "NoSchedule")]


def test_an_action_below_the_chosen_one_does_not_taint(capsys, monkeypatch, api_server):
    code, err = _health_tainting(capsys, monkeypatch, api_server, POWER_BRAKE)  # ask_provider < reset_gpu
    assert code == 1 and "already without the gpuvet.dev/action taint" in err
    assert _taints() == [("nvidia.com/gpu", "present", "NoSchedule")]
    code, err = _health_tainting(capsys, monkeypatch, api_server, POWER_BRAKE, taint="ask_provider")
    assert "tainted node n1 gpuvet.dev/action=ask_provider:NoSchedule" in err


def test_a_node_changed_meanwhile_is_read_again_and_nothing_is_lost(capsys, monkeypatch, api_server):
    _ApiServer.changed_under_us = 1  # another controller patches the node between gpuvet's read and its patch
    code, err = _health_tainting(capsys, monkeypatch, api_server, POWER_BRAKE, XID79_ON_GPU3)
    assert code == 1 and "tainted node n1" in err
    assert [r.get("method", "PATCH") for r in _ApiServer.seen] == ["GET", "PATCH", "GET", "PATCH"]


def test_a_refused_taint_is_one_line_and_the_health_answer_stands(capsys, monkeypatch, api_server):
    _ApiServer.refuse = True
    code, err = _health_tainting(capsys, monkeypatch, api_server, POWER_BRAKE, XID79_ON_GPU3)
    assert code == 1 and 'not tainted: the API server refused to taint node n1: HTTP 403 nodes "n1" is forbidden' in err
    assert "Traceback" not in err
