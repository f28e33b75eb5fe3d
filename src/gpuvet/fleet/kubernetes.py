"""Labelling and tainting this pod's node from inside the cluster, with the pod's service account
(which needs `get` and `patch` on nodes: the gpuvet-node-labeller ClusterRole in
deploy/kubernetes/gpuvet-run-job.yaml, gpuvet-npd-taint in deploy/kubernetes/gpuvet-taint-rbac.yaml).
Labels are one merge patch; the taint is a JSON patch of the node's whole taint list that first
tests the resourceVersion it was read at, so a taint another controller added meanwhile is never
lost (a conflict is read again and retried). Every call is bounded in time."""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
API_TIMEOUT_S = 10.0


class KubernetesError(Exception):
    """Not in a cluster, or the API server refused: the message is the line shown."""


@dataclass
class ApiServer:
    url: str  # https://10.0.0.1:443
    token: str
    ca_file: str | None


def in_cluster(account_dir: str = SERVICE_ACCOUNT) -> ApiServer:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubernetesError("not inside a Kubernetes pod (no KUBERNETES_SERVICE_HOST): run it from the Job in "
                              "deploy/kubernetes, or label by hand with `kubectl label node`")
    try:
        with open(os.path.join(account_dir, "token"), encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as err:
        raise KubernetesError(f"no service account token ({err.strerror or err}): set automountServiceAccountToken") from None
    ca = os.path.join(account_dir, "ca.crt")
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return ApiServer(f"https://{host}:{port}", token, ca if os.path.exists(ca) else None)


def label_node(api: ApiServer, node: str, labels: dict[str, str]) -> None:
    _call(api, "PATCH", node, "label", {"metadata": {"labels": labels}}, "application/merge-patch+json")


# The taint gpuvet puts on a node whose health asks for at least the action chosen (--taint): its
# value is that action, so a toleration, a scheduler or NVSentinel can match on it.
TAINT_KEY = "gpuvet.dev/action"
TAINT_EFFECT = "NoSchedule"
_CONFLICT_TRIES = 3


class _Conflict(Exception):
    """The node changed between reading and patching it (the JSON patch's test failed)."""


def set_taint(api: ApiServer, node: str, value: str | None) -> str:
    """Put gpuvet's taint on `node` with `value` (None: take it off); returns what was done.
    Idempotent: a node already as asked is not patched."""
    for _ in range(_CONFLICT_TRIES):
        current = _call(api, "GET", node, "read")
        taints = list((current.get("spec") or {}).get("taints") or [])
        ours = [t for t in taints if t.get("key") == TAINT_KEY]
        wanted = [{"key": TAINT_KEY, "value": value, "effect": TAINT_EFFECT}] if value else []
        if [(t.get("value"), t.get("effect")) for t in ours] == [(t["value"], t["effect"]) for t in wanted]:
            return f"node {node} already {'tainted ' + TAINT_KEY + '=' + value if value else 'without the ' + TAINT_KEY + ' taint'}"
        others = [t for t in taints if t.get("key") != TAINT_KEY]
        version = (current.get("metadata") or {}).get("resourceVersion")
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": version},
                 {"op": "replace" if "taints" in (current.get("spec") or {}) else "add", "path": "/spec/taints",
                  "value": others + wanted}]
        try:
            _call(api, "PATCH", node, "taint", patch, "application/json-patch+json")
        except _Conflict:
            continue
        return f"tainted node {node} {TAINT_KEY}={value}:{TAINT_EFFECT}" if value else f"took the {TAINT_KEY} taint off node {node}"
    raise KubernetesError(f"node {node} kept changing while gpuvet tainted it ({_CONFLICT_TRIES} tries): try again")


def _call(api: ApiServer, method: str, node: str, verb: str, body: object = None, content_type: str = "") -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {api.token}", "Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    request = urllib.request.Request(f"{api.url}/api/v1/nodes/{quote(node, safe='')}", data=data, method=method,
                                     headers=headers)
    context = ssl.create_default_context(cafile=api.ca_file) if api.url.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S, context=context) as response:
            answer = response.read()
    except urllib.error.HTTPError as err:
        said = err.read(500).decode(errors="replace")
        message = json.loads(said).get("message", said) if said.startswith("{") else said
        if err.code in (409, 422) and verb == "taint" and "test" in message.lower():
            raise _Conflict() from None
        raise KubernetesError(f"the API server refused to {verb} node {node}: HTTP {err.code} {message}".strip()) from None
    except (urllib.error.URLError, OSError) as err:  # unreachable, TLS, timeout
        raise KubernetesError(f"cannot reach the API server at {api.url}: {getattr(err, 'reason', err)}") from None
    try:
        return json.loads(answer) if answer.strip() else {}
    except ValueError:
        raise KubernetesError(f"the API server's answer to {verb} node {node} is not JSON") from None
