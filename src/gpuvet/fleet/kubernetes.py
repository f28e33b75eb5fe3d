"""Labelling this pod's node from inside the cluster: one merge patch of the node's labels to
the API server, with the pod's service account (which needs `patch` on nodes: the
gpuvet-node-labeller ClusterRole in deploy/kubernetes/gpuvet-run-job.yaml). Bounded in time."""

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
    body = json.dumps({"metadata": {"labels": labels}}).encode()
    request = urllib.request.Request(f"{api.url}/api/v1/nodes/{quote(node, safe='')}", data=body, method="PATCH",
                                     headers={"Content-Type": "application/merge-patch+json",
                                              "Authorization": f"Bearer {api.token}", "Accept": "application/json"})
    context = ssl.create_default_context(cafile=api.ca_file) if api.url.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S, context=context) as response:
            response.read()
    except urllib.error.HTTPError as err:
        said = err.read(500).decode(errors="replace")
        message = json.loads(said).get("message", said) if said.startswith("{") else said
        raise KubernetesError(f"the API server refused to label node {node}: HTTP {err.code} {message}".strip()) from None
    except (urllib.error.URLError, OSError) as err:  # unreachable, TLS, timeout
        raise KubernetesError(f"cannot reach the API server at {api.url}: {getattr(err, 'reason', err)}") from None
