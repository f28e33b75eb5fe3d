"""Putting a run together: probe (or read captures) -> judge -> one run record.

The CLI stays thin; this is where the stages meet. Judge and report never import probe.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from typing import Any, Callable

from . import judge
from .bench import host_plan
from .bench import plan as bench_plan
from .facts import Machine, from_dict
from .probe import capture, live
from .probe.errors import CaptureError
from .record import SCHEMA, Measurement, RunRecord


# Every benchmark, in the order a default run takes them: the host first (no GPU needed), then
# the GPUs.
ALL_BENCHMARKS = host_plan.HOST + bench_plan.ALL
RUN_WORKLOAD_STEPS = 50  # `gpuvet run` proves the platform end to end; `gpuvet workload` trains longer


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def run_live(
    quick: bool = True,
    expect: str | None = None,
    workdir: str | None = None,
    benchmarks: list[str] | None = None,
    device: str = "cuda",
    soak_minutes: float | None = None,
    force: bool = False,
    preemptible: bool | None = None,
    paths: list[str] | None = None,
    engine: str = "auto",
    workload_steps: int | None = None,
    progress: Callable[[str], None] = lambda message: None,
    needs: dict[str, Any] | None = None,
) -> RunRecord:
    """Facts, then (unless quick) benchmarks, judged. `benchmarks` picks some; None: all of them.
    `paths`: directories to test storage on (default: the working directory)."""
    started, t0 = _now(), time.monotonic()
    names = [] if quick and benchmarks is None else list(benchmarks or ALL_BENCHMARKS)
    options: dict[str, Any] = {"profile": _profile(quick, benchmarks, soak_minutes), "benchmarks": names}
    if names:
        options["device"] = device
    options.update(needs or {})  # dataset_gb, checkpoint_gb, multi_node: what the judge weighs storage against
    for key, value in (("expect", expect), ("soak_minutes", soak_minutes), ("paths", paths),
                       ("workload_steps", workload_steps), ("preemptible", preemptible)):
        if value is not None:
            options[key] = value
    progress("reading the machine's facts")
    machine = live.collect(workdir=workdir)
    judge.annotate_references(machine)
    record = RunRecord(machine=machine, started_at=started, options=options)
    host_names = [n for n in names if n in host_plan.HOST]
    gpu_names = [n for n in names if n in bench_plan.ALL]
    measurements = host_plan.run(host_names, paths or [workdir or os.getcwd()], engine, progress) if host_names else []
    if gpu_names:
        if workload_steps is None and benchmarks is None:
            workload_steps = RUN_WORKLOAD_STEPS  # the default run's short version of the workload
        workload = {k: v for k, v in (("steps", workload_steps), ("path", (paths or [None])[0])) if v is not None}
        outcome = bench_plan.run(machine, gpu_names, device=device, force=force, soak_minutes=soak_minutes,
                                 progress=progress, workload=workload)
        measurements += outcome.measurements
        record.series = outcome.series
    record.measurements = [from_dict(Measurement, m) for m in measurements]
    record.findings = judge.judge(machine, record.measurements, options)
    record.duration_s = time.monotonic() - t0
    return record


def _profile(quick: bool, benchmarks: list[str] | None, soak_minutes: float | None) -> str:
    if benchmarks is not None:
        return "bench"
    if soak_minutes:
        return "soak"
    return "quick" if quick else "default"


def inspect(paths: list[str], expect: str | None = None) -> RunRecord:
    """Judge captures taken elsewhere (several files of one machine merge into one record),
    or judge a stored run record again with the current rules."""
    started, t0 = _now(), time.monotonic()
    options: dict[str, Any] = {"expect": expect} if expect else {}
    records = [p for p in paths if _is_record(p)]
    if records:
        if len(paths) > 1:
            raise CaptureError(f"{records[0]}: a gpuvet run record is judged on its own; give it without other captures")
        return rejudge(load_record(records[0]), expect)
    captures = []
    for path in paths:
        captures += capture.read_captures(path)
    machine = capture.merge(captures)
    judge.annotate_references(machine)
    record = RunRecord(machine=machine, started_at=started, options=options)
    record.findings = judge.judge(machine, record.measurements, options)
    record.duration_s = time.monotonic() - t0
    return record


def rejudge(record: RunRecord, expect: str | None = None) -> RunRecord:
    """The same facts and measurements, judged by this version's rules."""
    options = dict(record.options)
    if expect:
        options["expect"] = expect
    judge.annotate_references(record.machine)
    record.options = options
    record.findings = judge.judge(record.machine, record.measurements, options)
    return record


def _is_record(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and SCHEMA.encode() in head


def load_watch_log(path: str) -> RunRecord | None:
    """A `gpuvet watch --log` file as a record holding its time series (None: not a watch log)."""
    from . import watch

    try:
        with open(path, encoding="utf-8") as f:
            header = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict) or header.get("schema") != watch.LOG_SCHEMA:
        return None
    started = datetime.fromtimestamp(header.get("t0") or 0, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    try:
        series = watch.read_log(path)
    except (OSError, ValueError, KeyError) as err:
        raise CaptureError(f"{path}: a broken watch log ({err})") from None
    return RunRecord(machine=Machine(source="watch"), started_at=started, series=series,
                     options={"profile": "watch", "log": path})


def load_record(path: str) -> RunRecord:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return RunRecord.from_dict(data)
    except OSError as err:
        raise CaptureError(f"{path}: cannot read it ({err.strerror or err})") from None
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise CaptureError(f"{path}: not a readable gpuvet run record ({err})") from None
