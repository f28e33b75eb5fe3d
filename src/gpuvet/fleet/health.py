"""`gpuvet health`: the passive facts of this node (or of captures) judged by the health rules,
as one run record of its own kind (options["profile"] == "health")."""

from __future__ import annotations

import time

from .. import judge
from ..facts import Machine
from ..judge import health as health_rules
from ..judge.gpu_xid import HEALTH_WINDOW_S
from ..probe import capture, live, nvml
from ..record import RunOptions, RunRecord, parse_timestamp, timestamp
from ..store import Store, machine_identity

PROFILE = "health"


def check(captures: list[str] | None = None, expect_gpus: int | None = None,
          budgets_s: dict[str, float] | None = None, machine: Machine | None = None,
          skip: list[str] | None = None, xid_window_s: float | None = HEALTH_WINDOW_S) -> RunRecord:
    """This node's health (or that of the machine in `captures`, or a `machine` already read).
    gpu.xid judges kernel-log events of the last `xid_window_s` (None: since boot)."""
    started, t0 = timestamp(), time.monotonic()
    budgets = {**live.HEALTH_BUDGETS_S, **(budgets_s or {})}
    if machine is None:
        if captures:
            machine = capture.merge([c for path in captures for c in capture.read_captures(path)])
        else:
            machine = live.collect_passive(budgets)
            _mark_replay(machine)
    judge.annotate_references(machine)
    options = RunOptions(profile=PROFILE, probe_budgets_s=budgets, xid_window_s=xid_window_s)
    if expect_gpus is not None:
        options["expect_gpus"] = expect_gpus
    if skip:
        options["skip"] = sorted(set(skip))
    record = RunRecord(machine=machine, started_at=started, options=options)
    record.findings = judge.judge_health(machine, options)
    record.duration_s = time.monotonic() - t0
    return record


def _mark_replay(machine: Machine) -> None:
    """Under GPUVET_NVML_REPLAY the GPU facts are a capture's: the record says so, as `run`'s does,
    never "live" (its history would otherwise hold a test capture as this node's health)."""
    replayed = nvml.replayed_from()
    if replayed and machine.source == "live":
        machine.source = f"replay: {replayed}"
        machine.captures.append({"path": replayed, "kind": "nvml-replay"})


def outcome(record: RunRecord) -> str:
    """healthy / problem / unknown (judge.health.EXIT_CODES maps them to 0 / 1 / 2)."""
    return health_rules.outcome(record.machine, record.findings)


# `--keep changes`: a scheduler runs the check every minute or so; a 48 KB record each time is
# 70 MB a day on an 8-GPU node. A run is kept when its summary differs from the last kept health
# run of this machine (the moment it started or stopped failing), and at least once an hour.
HEARTBEAT_S = 3600.0


def worth_keeping(store: Store, record: RunRecord, heartbeat_s: float = HEARTBEAT_S) -> bool:
    key = machine_identity(record.machine).key
    last = next(iter(store.runs(machine_key=key, kind=PROFILE, limit=1)), None)
    if last is None or last.summary != record.options.get("summary"):
        return True
    try:
        then, now = parse_timestamp(last.started_at), parse_timestamp(record.started_at)
    except ValueError:
        return True
    return (now - then).total_seconds() >= heartbeat_s
