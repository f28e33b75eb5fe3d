"""A run record as Kubernetes node labels (gpuvet.dev/verdict, model, power cap, ...), so a
scheduler can select or avoid nodes by what gpuvet found: `nodeSelector: {gpuvet.dev/verdict: pass}`.

Label values are at most 63 characters of [A-Za-z0-9._-], beginning and ending with a letter or
digit (Kubernetes' label syntax); anything else in a GPU's name becomes "-"."""

from __future__ import annotations

import re

from ..record import RunRecord

PREFIX = "gpuvet.dev/"
_VALUE_MAX = 63
_INVALID = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """`text` as a valid label value ("" when nothing of it is valid)."""
    value = _INVALID.sub("-", text.strip())[:_VALUE_MAX]
    return value.strip("-._")


def node_labels(record: RunRecord) -> dict[str, str]:
    gpus = record.machine.gpus
    models = sorted({g.name for g in gpus if g.name})
    caps = [g.power.enforced_limit_w for g in gpus if g.power.enforced_limit_w]
    labels = {
        "verdict": record.verdict,
        "action": record.action,  # what a remediator does about the node (gpuvet.actions)
        "kind": str(record.options.get("profile") or "default"),
        "gpus": str(len(gpus)),
        "model": models[0] if len(models) == 1 else ("mixed" if models else "none"),
        # The lowest enforced limit: the GPU a job waits for.
        "power-cap-w": f"{min(caps):.0f}" if caps else "unknown",
        "checked-at": record.started_at.replace(":", "-"),
    }
    return {PREFIX + key: label_value(value) for key, value in labels.items()}
