"""deploy/: what a remediator acts on. The CEL of NVSentinel's policies (deploy/nvsentinel) and of
the ValidatingAdmissionPolicy (deploy/kubernetes) evaluated by a CEL interpreter (cel-python) on
the node conditions real faults produce (their summary line, as node-problem-detector sets it) and
on gpuvet's taint; the hardened and DRA variants kept in step with the plain manifests."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuvet import actions
from gpuvet.fleet import health
from gpuvet.report.health import summary_line
from test_deploy import KUBERNETES_VERSION, _kind
from test_fleet_actions import FAULTS, HEALTHY

celpy = pytest.importorskip("celpy", reason="cel-python evaluates the shipped CEL (pip install cel-python)")

ROOT = Path(__file__).resolve().parents[1]
NVSENTINEL = ROOT / "deploy" / "nvsentinel" / "values-gpuvet.yaml"
ADMISSION = ROOT / "deploy" / "kubernetes" / "gpuvet-admission-policy.yaml"
CONDITION = "GpuvetGPUProblem"


def _summary(captures: list[Path]) -> str:
    record = health.check(captures=[str(c) for c in captures])
    return summary_line(record, health.outcome(record))


def _node(message: str | None = None, status: str = "True", taint: str | None = None, cordoned: bool = False,
          annotations: dict | None = None) -> dict:
    node: dict = {"metadata": {"name": "n1", "annotations": annotations or {}}, "spec": {}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "message": "kubelet is posting ready status"}]}}
    if message is not None:
        node["status"]["conditions"].append({"type": CONDITION, "status": status, "message": message})
    if taint:
        node["spec"]["taints"] = [{"key": "gpuvet.dev/action", "value": taint, "effect": "NoSchedule"}]
    if cordoned:
        node["spec"]["unschedulable"] = True
    return node


def _value(expression: str, **variables):
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return program.evaluate({name: celpy.json_to_cel(value) for name, value in variables.items()})


def _evaluate(expression: str, **variables) -> bool:
    return bool(_value(expression, **variables))


# -- NVSentinel's kubernetes-object-monitor ---------------------------------------------------------

def _policies() -> list[dict]:
    return yaml.safe_load(NVSENTINEL.read_text())["kubernetes-object-monitor"]["policies"]


def _matching(node: dict) -> list[str]:
    return [p["name"] for p in _policies() if _evaluate(p["predicate"]["expression"], resource=node)]


def test_each_policy_raises_nvsentinels_action_of_the_same_meaning():
    for policy in _policies():
        action = policy["name"].removeprefix("gpuvet-").replace("-", "_")
        event = policy["healthEvent"]
        assert event["recommendedAction"] == actions.BY_NAME[action].nvsentinel
        assert event["isFatal"] == (actions.rank(action) > actions.rank(actions.WARN_CEILING))  # a warning never quarantines
        assert policy["resource"] == {"group": "", "version": "v1", "kind": "Node"}
        assert _value(policy["nodeAssociation"]["expression"], resource=_node()) == "n1"  # the event names the node


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_real_fault_triggers_exactly_the_policy_of_its_action(fault):
    captures, _, action, _ = FAULTS[fault]
    message = _summary(captures)  # what node-problem-detector puts in the condition
    expected = [f"gpuvet-{action.replace('_', '-')}"] if action in ("ask_provider", "reset_gpu", "reboot_node",
                                                                     "drain_and_repair") else []
    assert _matching(_node(message)) == expected
    assert _matching(_node(message, status="False")) == []  # NPD's condition once healthy again
    assert _matching(_node(message, status="Unknown")) == []


def test_a_healthy_node_or_a_plain_node_triggers_nothing_and_the_taint_alone_does():
    assert _matching(_node(_summary([HEALTHY]), status="False")) == []
    assert _matching(_node()) == []  # no gpuvet condition at all (NPD not deployed yet)
    assert _matching(_node(taint="drain_and_repair")) == ["gpuvet-drain-and-repair"]


# -- the ValidatingAdmissionPolicy --------------------------------------------------------------------

def _admission() -> tuple[dict, dict]:
    policy, binding = [d for d in yaml.safe_load_all(ADMISSION.read_text()) if d]
    return policy, binding


def _admitted(old: dict, new: dict, user: str = "kubernetes-admin") -> list[str]:
    """The messages of the validations that refuse this update (none: admitted)."""
    policy, _ = _admission()
    context = {"object": new, "oldObject": old, "request": {"userInfo": {"username": user}}}
    variables = {v["name"]: _evaluate(v["expression"], **context) for v in policy["spec"]["variables"]}
    return [v["message"] for v in policy["spec"]["validations"]
            if not _evaluate(v["expression"], **context, variables=variables)]


def _uncordoned(node: dict) -> dict:
    new = copy.deepcopy(node)
    new["spec"]["unschedulable"] = False
    return new


def test_a_node_needing_a_reboot_stays_cordoned_until_gpuvet_passes():
    message = _summary(FAULTS["xid79-on-gpu3"][0])  # Xid 79: reboot_node
    cordoned = _node(message, cordoned=True)
    refused = _admitted(cordoned, _uncordoned(cordoned))
    assert len(refused) == 1 and "needs a reboot or a repair" in refused[0]
    # An admin's override, gpuvet itself, and a node gpuvet calls healthy again are admitted.
    overridden = _node(message, cordoned=True, annotations={"gpuvet.dev/override": "true"})
    assert _admitted(overridden, _uncordoned(overridden)) == []
    assert _admitted(cordoned, _uncordoned(cordoned), user="system:serviceaccount:kube-system:gpuvet-npd") == []
    healthy = _node(_summary([HEALTHY]), status="False", cordoned=True)
    assert _admitted(healthy, _uncordoned(healthy)) == []
    # A GPU reset does not keep the whole node out.
    reset = _node(_summary(FAULTS["xid154-reset"][0]), cordoned=True)
    assert _admitted(reset, _uncordoned(reset)) == []


def test_gpuvets_taint_is_kept_while_the_node_needs_a_repair():
    tainted = _node(taint="drain_and_repair")
    untainted = copy.deepcopy(tainted)
    untainted["spec"]["taints"] = []
    assert any("taint stays" in m for m in _admitted(tainted, untainted))
    assert _admitted(tainted, untainted, user="system:serviceaccount:kube-system:gpuvet-npd") == []
    assert _admitted(_node(taint="ask_provider"), _node()) == []  # a lesser action: an admin may lift it


def test_the_policy_is_bound_to_deny_and_matches_node_updates_only():
    policy, binding = _admission()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Ignore"  # never blocks nodes when it cannot be evaluated
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes"] and rule["operations"] == ["UPDATE"]


# -- the variants kept in step with the plain manifests ----------------------------------------------

def _without_gpu_access(pod_spec: dict) -> dict:
    """A pod spec less what decides how it gets its GPUs (claims, the toolkit's variable, the
    device plugin's request and node count)."""
    spec = copy.deepcopy(pod_spec)
    spec.pop("resourceClaims", None)
    spec.get("nodeSelector", {}).pop("nvidia.com/gpu.count", None)
    for container in spec["containers"]:
        container["env"] = [e for e in container.get("env", []) if e["name"] != "NVIDIA_VISIBLE_DEVICES"]
        resources = container.get("resources", {})
        resources.pop("claims", None)
        resources.get("limits", {}).pop("nvidia.com/gpu", None)
        container["resources"] = {k: v for k, v in resources.items() if v}
    return spec


def test_the_hardened_daemonset_differs_from_the_plain_one_only_in_how_it_sees_the_gpus():
    plain = _kind("DaemonSet", "node-problem-detector-gpuvet.yaml")
    hardened = _kind("DaemonSet", "node-problem-detector-gpuvet-hardened.yaml")
    assert hardened["metadata"] == plain["metadata"]  # the same name: it replaces the plain one
    pod = hardened["spec"]["template"]["spec"]
    assert _without_gpu_access(pod) == _without_gpu_access(plain["spec"]["template"]["spec"])
    container = pod["containers"][0]
    assert not container["securityContext"].get("privileged")
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in container["env"]
    claim = _kind("ResourceClaimTemplate", "node-problem-detector-gpuvet-hardened.yaml")
    (request,) = claim["spec"]["spec"]["devices"]["requests"]
    # Every GPU of the node, seen as a monitor: none taken from the jobs that hold them.
    assert request["exactly"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True}
    assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": claim["metadata"]["name"]}]
    assert claim["metadata"]["namespace"] == hardened["metadata"]["namespace"]


def test_the_dra_job_claims_every_gpu_of_its_node_exclusively():
    plain, dra = _kind("Job", "gpuvet-run-job.yaml"), _kind("Job", "gpuvet-run-job-dra.yaml")
    assert _without_gpu_access(dra["spec"]["template"]["spec"]) == _without_gpu_access(plain["spec"]["template"]["spec"])
    claim = _kind("ResourceClaimTemplate", "gpuvet-run-job-dra.yaml")
    (request,) = claim["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}  # no admin access


def test_the_device_plugin_job_is_stamped_for_each_gpu_count_as_its_comment_says(tmp_path):
    manifest = ROOT / "deploy" / "kubernetes" / "gpuvet-run-job.yaml"
    (command,) = [line.lstrip("# ").strip() for line in manifest.read_text().splitlines() if line.lstrip("# ").startswith("sed ")]
    stamped = subprocess.run(["sh", "-c", f"n=4; {command.removesuffix('| kubectl apply -f -')}"], cwd=ROOT, check=True,
                             capture_output=True, text=True, timeout=30).stdout
    job = next(d for d in yaml.safe_load_all(stamped) if d and d["kind"] == "Job")
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    pod = job["spec"]["template"]["spec"]
    assert job["metadata"]["name"] == "gpuvet-run-4gpu" and pod["nodeSelector"]["nvidia.com/gpu.count"] == "4"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert _without_gpu_access(pod) == _without_gpu_access(_kind("Job", "gpuvet-run-job.yaml")["spec"]["template"]["spec"])
