"""`gpuvet health --json`: one node's verdict as one object (gpuvet.health/1), in the shape fleet
checkers settled on (NVIDIA Health Validation's NodeVerdict, gpud's states): the status, the
action a remediator takes, the GPUs affected by index and UUID, each finding with its action, and
what could not be read, which is never a silent pass. report/health.py makes it from a health run."""

from __future__ import annotations

from typing import Annotated, TypedDict

from ..actions import NAMES as ACTION_NAMES
from .run import STATUSES
from .validate import OneOf

HEALTH_SCHEMA = "gpuvet.health/1"

# The whole answer for a scheduler: node-problem-detector's OK / NonOK / Unknown, with its exit codes
# (pkg/custompluginmonitor/types: OK 0, NonOK 1, Unknown 2); Slurm's HealthCheckProgram gets the same.
HEALTHY, PROBLEM, UNKNOWN = "healthy", "problem", "unknown"
OUTCOMES = (HEALTHY, PROBLEM, UNKNOWN)
EXIT_CODES = {HEALTHY: 0, PROBLEM: 1, UNKNOWN: 2}


class VerdictFinding(TypedDict):
    check: str
    subject: str  # gpu3, machine, ...
    gpu_uuid: str | None  # the GPU's UUID when the subject is one GPU
    status: Annotated[str, OneOf(STATUSES)]
    action: Annotated[str, OneOf(ACTION_NAMES)]
    summary: str
    remedy: str | None


class AffectedGpu(TypedDict):
    index: int
    uuid: str | None
    bus_id: str | None
    name: str | None
    status: Annotated[str, OneOf(STATUSES)]  # its worst finding's
    action: Annotated[str, OneOf(ACTION_NAMES)]  # the worst its findings ask for
    checks: list[str]  # the checks that failed or warned on it


class Unread(TypedDict):
    check: str
    subject: str
    reason: str  # why it could not be judged


class HealthVerdict(TypedDict):
    schema: str
    tool: str
    node: str | None  # the host name
    checked_at: str
    duration_s: float
    status: Annotated[str, OneOf(OUTCOMES)]
    exit_code: int
    action: Annotated[str, OneOf(ACTION_NAMES)]  # the worst any finding asks for
    summary: str  # the one line (at most 80 bytes of ASCII) a drain reason or node condition carries
    gpus: list[AffectedGpu]  # the GPUs with a failure or a warning
    findings: list[VerdictFinding]  # every finding, passes included
    unread: list[Unread]  # what could not be read or was left out (--skip): judged by nobody
