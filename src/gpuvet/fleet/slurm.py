"""`gpuvet health --slurm`: drain this node with the health summary as reason, and resume it
once healthy again, but only a drain gpuvet made (its reason ends with "(gpuvet)"): a node an
admin drained stays drained. Every scontrol call is bounded; a missing or refusing scontrol is
one clear line, never a traceback, and the health answer itself is unchanged by it.

slurmd 26.05.2+ (with SlurmctldParameters=health_check_report; always from 26.11) tells its
HealthCheckProgram what slurmctld thinks of the node: SLURM_NODE_IS_HEALTHY=yes when it is in
service (not down, drained, draining, failing or in a maintenance reservation), no otherwise, unset
before the node registers (the run at slurmd's start) and on older slurmd. With "yes" there is no
drain to undo and no one else's reason to keep, so gpuvet asks slurmctld nothing: a healthy node
costs no scontrol call at all, a failing one the drain alone. Otherwise it reads the node first."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass

from ..record.verdict import HEALTHY, PROBLEM
from ..report.health import drain_reason, is_gpuvet_reason

SCONTROL_TIMEOUT_S = 5.0  # each call; slurmctld answers in milliseconds when it is up

# `scontrol show node NAME -o`: one line of Key=Value fields; Reason comes last and is followed
# by who set it and when: "Reason=gpuvet: gpu2 ... [root@2026-12-01T23:16:01]".
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?:\s+\[[^\]]*@[^\]]*\])?\s*$")


@dataclass
class NodeState:
    name: str
    state: str  # "IDLE+DRAIN", "MIXED", "DOWN+DRAIN+NOT_RESPONDING", ...
    reason: str | None  # without the "[user@time]" Slurm appends

    @property
    def drained(self) -> bool:
        flags = self.state.upper().split("+")
        return any(flag in ("DRAIN", "DRAINED", "DRAINING") for flag in flags)

    @property
    def reason_by_other(self) -> bool:
        return bool(self.reason) and not is_gpuvet_reason(self.reason)

    @property
    def drained_by_gpuvet(self) -> bool:
        return self.drained and is_gpuvet_reason(self.reason)


class SlurmError(Exception):
    """scontrol is absent, timed out or refused: the message is the line shown."""


def node_name(given: str | None = None) -> str:
    """The Slurm name of this node: --node, else $SLURMD_NODENAME (set by slurmd for the programs
    it runs), else the short host name (Slurm's default NodeName)."""
    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _scontrol(*args: str) -> str:
    exe = shutil.which("scontrol")
    if exe is None:
        raise SlurmError("scontrol not found on PATH: is this a Slurm node? (install slurm-client)")
    try:
        done = subprocess.run([exe, *args], check=False, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"scontrol {args[0]} did not answer within {SCONTROL_TIMEOUT_S:g} s (slurmctld down?)") from None
    except OSError as err:
        raise SlurmError(f"scontrol cannot run: {err.strerror or err}") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split()) or f"exit status {done.returncode}"
        raise SlurmError(f"scontrol {' '.join(args[:2])} refused: {said}")
    return done.stdout


def parse_node(name: str, line: str) -> NodeState:
    state = _STATE.search(line)
    reason = _REASON.search(line)
    return NodeState(name, state.group(1) if state else "UNKNOWN", reason.group(1).strip() if reason else None)


def show(name: str) -> NodeState:
    return parse_node(name, _scontrol("show", "node", name, "-o").strip())


# What slurmd says of the node in SLURM_NODE_IS_HEALTHY (see above).
IN_SERVICE = "yes"


def slurmd_says_in_service(environ: dict[str, str] | None = None) -> bool:
    """True when slurmd told this program the node is in service (SLURM_NODE_IS_HEALTHY=yes)."""
    return (environ if environ is not None else os.environ).get("SLURM_NODE_IS_HEALTHY", "").strip().lower() == IN_SERVICE


def apply(outcome: str, summary: str, name: str, in_service: bool | None = None) -> str:
    """Drain, resume or leave the node for this health outcome; returns the line that says which.
    Idempotent: a node already drained by gpuvet for the same reason is left as it is.
    `in_service`: slurmd's SLURM_NODE_IS_HEALTHY=yes (default: read from the environment)."""
    if in_service is None:
        in_service = slurmd_says_in_service()
    if in_service and outcome == HEALTHY:
        return f"slurm: {name} healthy and in service (slurmd says so): nothing to do"
    if in_service and outcome == PROBLEM:  # not drained or down: nobody's reason to keep
        return _drain(name, drain_reason(summary))
    if in_service:
        return f"slurm: could not tell the GPUs' health: {name} left in service"
    node = show(name)
    if outcome == PROBLEM:
        if (node.drained and not node.drained_by_gpuvet) or node.reason_by_other:
            # An admin's drain, or Slurm's own DOWN with its reason: gpuvet's drain would replace
            # that reason, and its later resume would undo what it did not do.
            return f"slurm: {name} already drained or down by someone else ({node.reason or 'no reason'}): left as is"
        reason = drain_reason(summary)
        if node.drained_by_gpuvet and node.reason == reason:
            return f"slurm: {name} already drained by gpuvet for this reason"
        return _drain(name, reason)
    if outcome == HEALTHY:
        if node.drained_by_gpuvet:
            _scontrol("update", f"NodeName={name}", "State=RESUME")
            return f"slurm: resumed {name} (gpuvet had drained it: {node.reason})"
        if node.drained:
            return f"slurm: {name} is healthy but drained by someone else ({node.reason or 'no reason'}): left drained"
        return f"slurm: {name} healthy, {node.state}: nothing to do"
    return f"slurm: could not tell the GPUs' health: {name} left {node.state}"


def _drain(name: str, reason: str) -> str:
    _scontrol("update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")
    return f"slurm: drained {name}: {reason}"
