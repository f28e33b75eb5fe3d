"""Putting a run together: probe (or read captures) -> judge -> one run record.

The CLI stays thin; this is where the stages meet. Judge and report never import probe.
"""

from __future__ import annotations

import json
import os
import time
import typing
from datetime import datetime, timezone
from typing import Any, Callable

from . import catalog, judge
from .bench import host_plan, schedule
from .bench import plan as bench_plan
from .facts import Machine, from_dict
from .probe import capture, live, nvml, nvml_events
from .probe.errors import CaptureError
from .record import SCHEMA, Measurement, RecordError, RunOptions, RunRecord, Series, timestamp
from .record.load import RUN, load
from .record.watch import check_watch_line, is_watch_header, parse_log


# Every benchmark, in the order a default run takes them: the host first (no GPU needed), then
# the GPUs.
ALL_BENCHMARKS = catalog.ALL_BENCHMARKS


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
    xid_window_s: float | None = None,
) -> RunRecord:
    """Facts, then (unless quick) benchmarks, judged. `benchmarks` picks some; None: all of them.
    `paths`: directories to test storage on besides the working directory (the first one also
    takes the workload's checkpoint)."""
    started, t0 = timestamp(), time.monotonic()
    names = [] if quick and benchmarks is None else list(benchmarks or ALL_BENCHMARKS)
    options = _run_options(names, _profile(quick, benchmarks, soak_minutes), device, needs, expect=expect,
                           soak_minutes=soak_minutes, paths=paths, workload_steps=workload_steps, preemptible=preemptible)
    options["xid_window_s"] = xid_window_s  # gpu.xid's window; None (since boot) recorded too
    host_names = [n for n in names if n in host_plan.HOST]
    host_plan.prepare(host_names)
    progress("reading the machine's facts")
    machine = live.collect(workdir=workdir)
    judge.annotate_references(machine)
    record = RunRecord(machine=machine, started_at=started, options=options)
    gpu_names = [n for n in names if n in bench_plan.ALL]
    storage = storage_paths(workdir or os.getcwd(), paths)
    # The order bench/schedule.py plans: the CPU feed rate alone first; storage and network while the
    # GPUs hold the sustained load (when one runs), else on their own.
    alongside = [n for n in schedule.ALONGSIDE_SUSTAINED if n in host_names] if "sustained" in gpu_names else []
    host_done: list[dict[str, Any]] = []
    ran_alongside: list[bool] = []
    wall_s: dict[str, float] = {"facts": round(time.monotonic() - t0, 2)}  # each step's, against the plan's

    def host(names: list[str]) -> list[dict[str, Any]]:
        found = []
        for name in names:
            t1 = time.monotonic()
            found += host_plan.run([name], storage, engine, progress)
            wall_s[name] = round(time.monotonic() - t1, 2)
        return found

    def host_alongside() -> None:
        ran_alongside.append(True)
        host_done.extend(host(alongside))

    measurements = host([n for n in host_names if n not in alongside])

    if gpu_names:
        if workload_steps is None and benchmarks is None:
            workload_steps = schedule.RUN_WORKLOAD_STEPS  # the default run's short version of the workload
        # The checkpoint goes where the user pointed (their first --path), else the working directory.
        workload = {k: v for k, v in (("steps", workload_steps), ("path", paths[0] if paths else None)) if v is not None}
        outcome = _gpu_benchmarks(machine, gpu_names, device, progress, force=force, soak_minutes=soak_minutes,
                                  workload=workload, profile=options["profile"],
                                  alongside_sustained=host_alongside if alongside else None)
        measurements += outcome.measurements
        record.series = outcome.series
        wall_s.update(outcome.wall_s)
    if alongside and not ran_alongside:  # no sustained load ran (no GPU, no PyTorch): on their own
        host_alongside()
    measurements += host_done
    if names:
        options["step_wall_s"] = wall_s
    record.measurements = [from_dict(Measurement, m) for m in measurements]
    record.findings = judge.judge(machine, record.measurements, options)
    if options["profile"] == "bench":  # `gpuvet bench NAME`: that benchmark's checks, not the whole audit
        record.findings = judge.of_benchmarks(record.findings, names, expect=expect is not None)
    record.duration_s = time.monotonic() - t0
    return record


def run_net_test(host: str, port: int, engine: str, seconds: float,
                 progress: Callable[[str], None] = lambda message: None, expect: str | None = None,
                 multi_node: bool = False) -> RunRecord:
    """`gpuvet net test HOST`: this machine's facts (its NICs: the link the test is judged against)
    and the measurements to HOST, judged into one run record (profile "net-test")."""
    from .bench import net as net_bench

    started, t0 = timestamp(), time.monotonic()
    options = RunOptions(profile="net-test", benchmarks=[], peer=host, port=port, engine=engine)
    if expect is not None:
        options["expect"] = expect
    if multi_node:
        options["multi_node"] = True
    progress("reading the machine's facts")
    machine = live.collect()
    judge.annotate_references(machine)
    measurements = net_bench.test(host, port=port, engine=engine, budget_s=seconds, progress=progress)
    record = RunRecord(machine=machine, started_at=started, options=options,
                       measurements=[from_dict(Measurement, m) for m in measurements])
    record.findings = judge.judge(machine, record.measurements, options)
    record.duration_s = time.monotonic() - t0
    return record


def plan_live(quick: bool = False, soak_minutes: float | None = None, force: bool = False,
              paths: list[str] | None = None, workload_steps: int | None = None,
              benchmarks: list[str] | None = None, device: str = "cuda", workdir: str | None = None) -> schedule.Plan:
    """What `run_live` with the same options would do on this machine, without running it: the
    facts are read (read-only, seconds), nothing is loaded."""
    machine = live.collect(workdir=workdir)
    names = [] if quick and benchmarks is None else list(benchmarks or ALL_BENCHMARKS)
    if workload_steps is None and benchmarks is None:
        workload_steps = schedule.RUN_WORKLOAD_STEPS
    return schedule.plan(machine, names, device, _profile(quick, benchmarks, soak_minutes), soak_minutes, force,
                         len(storage_paths(workdir or os.getcwd(), paths)), workload_steps,
                         cannot_run=bench_plan.cannot_run(machine, device) if names else None)


def plan_captures(paths: list[str], soak_minutes: float | None = None) -> schedule.Plan:
    """What the default `gpuvet run` would do on the machine in these captures, assuming PyTorch
    with CUDA there (a capture does not show the Python stack)."""
    captures = []
    for path in paths:
        captures += capture.read_captures(path)
    machine = capture.merge(captures)
    result = schedule.plan(machine, list(ALL_BENCHMARKS), "cuda", _profile(False, None, soak_minutes), soak_minutes,
                           workload_steps=schedule.RUN_WORKLOAD_STEPS)
    result.notes.append("assumes PyTorch with CUDA on that machine (a capture does not show the Python stack) "
                        "and storage tested in the working directory only")
    return result


def _run_options(names: list[str], profile: str, device: str, needs: dict[str, Any] | None, **given: Any) -> RunOptions:
    """What the run was asked, as its record keeps it: the profile and benchmarks, the device when
    any benchmark runs, the storage needs, and each of `given` that is not None."""
    asked: dict[str, Any] = {"profile": profile, "benchmarks": names}
    if names:
        asked["device"] = device
    asked.update(needs or {})  # dataset_gb, checkpoint_gb, multi_node: what the judge weighs storage against
    asked.update({key: value for key, value in given.items() if value is not None})
    return typing.cast(RunOptions, asked)  # the keys above are RunOptions'; the loader checks their types


def _gpu_benchmarks(machine: Machine, names: list[str], device: str, progress: Callable[[str], None], *,
                    force: bool, soak_minutes: float | None, workload: dict[str, Any], profile: str,
                    alongside_sustained: Callable[[], None] | None) -> bench_plan.Outcome:
    """bench/plan.py's run of the GPU benchmarks, NVML's Xid events watched meanwhile: each is kept
    on the machine, named by the benchmark it hit."""
    xids = _watch_xids(machine) if device == "cuda" else None

    def step(message: str) -> None:
        if xids is not None and message.startswith("benchmark "):
            xids.during = message  # an Xid from now on names this benchmark
        progress(message)

    try:
        return bench_plan.run(machine, names, device=device, force=force, soak_minutes=soak_minutes, progress=step,
                              workload=workload, profile=profile, alongside_sustained=alongside_sustained)
    finally:
        if xids is not None:
            xids.stop()
            machine.nvml_xid_events = xids.as_kernel_events({g.index: g.pcie.bus_id for g in machine.gpus})
            nvml.shutdown()


def _watch_xids(machine: Machine) -> nvml_events.XidWatch | None:
    """NVML's Xid events while the benchmarks run (NVML started again: the facts probe shut it)."""
    if not machine.gpus or nvml.init_error() is not None:
        return None
    return nvml_events.XidWatch(len(machine.gpus), during="the benchmarks")


def storage_paths(workdir: str, paths: list[str] | None) -> list[str]:
    """Where storage is tested: the working directory, and every --path too (the same directory
    named twice, in any spelling, is tested once)."""
    chosen: dict[str, str] = {}
    for path in [workdir, *(paths or [])]:
        chosen.setdefault(os.path.realpath(path), path)
    return list(chosen.values())


def _profile(quick: bool, benchmarks: list[str] | None, soak_minutes: float | None) -> str:
    if benchmarks is not None:
        return "bench"
    if soak_minutes:
        return "soak"
    return "quick" if quick else "default"


def inspect(paths: list[str], expect: str | None = None, xid_window_s: float | None = None) -> RunRecord:
    """Judge captures taken elsewhere (several files of one machine merge into one record),
    or judge a stored run record again with the current rules. `xid_window_s`: gpu.xid's window
    (None or 0: since boot), counted back from the kernel log's last dated line."""
    started, t0 = timestamp(), time.monotonic()
    options = RunOptions(expect=expect) if expect else RunOptions()
    options["xid_window_s"] = xid_window_s or None
    records = [p for p in paths if saved_json_kind(p) == "record"]
    if records:
        if len(paths) > 1:
            raise CaptureError(f"{records[0]}: a gpuvet run record is judged on its own; give it without other captures")
        return rejudge(load_record(records[0]), expect, xid_window_s)
    captures = []
    for path in paths:
        captures += capture.read_captures(path)
    machine = capture.merge(captures)
    judge.annotate_references(machine)
    record = RunRecord(machine=machine, started_at=started, options=options)
    for loop in capture.loop_series(captures):  # `nvidia-smi dmon`, `--query-gpu ... -l 5`
        record.series.append(typing.cast(Series, loop))
        record.measurements.append(Measurement("capture.telemetry", len(loop["rows"]), "samples", loop["subject"], loop))
    record.findings = judge.judge(machine, record.measurements, options)
    record.duration_s = time.monotonic() - t0
    return record


def rejudge(record: RunRecord, expect: str | None = None, xid_window_s: float | None = None) -> RunRecord:
    """The same facts and measurements, judged by this version's rules (and `xid_window_s` when
    given: 0 is since boot; None keeps the record's)."""
    options = RunOptions(**record.options)
    if expect:
        options["expect"] = expect
    if xid_window_s is not None:
        options["xid_window_s"] = xid_window_s or None
    judge.annotate_references(record.machine)
    record.options = options
    if options.get("profile") == "health":  # a `gpuvet health` record: its own passive rules
        record.findings = judge.judge_health(record.machine, options)
    else:
        record.findings = judge.judge(record.machine, record.measurements, options)
    return record


def saved_json_kind(path: str) -> str | None:
    """"record" for a gpuvet run record, "export" for a `gpuvet export` file (a list of them),
    None for anything else, judged from the file's first bytes."""
    if not os.path.isfile(path):  # a FIFO or a device: never a saved record, and opening one may block
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(512).lstrip()
    except OSError:
        return None
    if SCHEMA.encode() not in head:
        return None
    return {b"{": "record", b"[": "export"}.get(head[:1])


def load_watch_log(path: str) -> RunRecord | None:
    """A `gpuvet watch --log` file as a record (None: not a watch log): its time series, the GPUs
    its header names (with the facts the plots' reference lines need, where the log has them),
    the watched time, and the time each GPU spent in each diagnosis as findings, with a line for
    the followed job's CPU and IO, a SKIP saying why when no GPU was watched, and one saying so
    when the log's last line was cut off (a watch stopped mid-write, or still writing: skipped).
    The record says it is a watch log by options["profile"] == "watch" (options["log"]: the file)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return watch_log_record(data, path)


def watch_log_record(data: bytes, path: str) -> RunRecord | None:
    """load_watch_log of a log already read (`path`: where it came from, "stdin" for `-`)."""
    from .judge.watch_log import judge_watch_log

    # The header is the first line that is not blank, as record.load and watch.read_log take it.
    number, first = next(((n, line) for n, line in enumerate(data.split(b"\n"), 1) if line.strip()), (1, b"{}"))
    try:
        header = json.loads(first.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    if not is_watch_header(header):
        return None
    header = check_watch_line(header, f"{path}: line {number}")  # RecordError: a header field of the wrong type
    started = timestamp(datetime.fromtimestamp(header.get("t0") or 0, timezone.utc))
    notes: list[str] = []
    try:
        series = parse_log(data, notes)
        machine = _watched_machine(header, series)
        sessions = _watch_sessions(series)
    except RecordError as err:
        raise RecordError(f"{path}: {err}") from None
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        raise CaptureError(f"{path}: a broken watch log ({err})") from None
    findings = judge_watch_log(series, sessions, bool(machine.gpus), machine.gpu_error, notes, path)
    return RunRecord(machine=machine, started_at=started, series=typing.cast(list[Series], series), findings=findings,
                     duration_s=sum(sessions.values()), options={"profile": "watch", "log": path})


def _watch_sessions(series: list[dict[str, Any]]) -> dict[Any, float]:
    """Each session (by its t0) -> the seconds it covers: the last t any of its rows has."""
    ends: dict[Any, float] = {}
    for s in series:
        last = max((row[0] for row in s["rows"] if isinstance(row[0], (int, float))), default=0.0)
        ends[s["t0"]] = max(ends.get(s["t0"], 0.0), float(last))
    return ends


def _watched_machine(header: dict[str, Any], series: list[dict[str, Any]]) -> Machine:
    """The machine as the log's headers describe it: hostname, driver, and each GPU with the facts
    its header gave (the latest session's, where several sessions name the same GPU)."""
    from .facts import Driver, Gpu, Host

    gpus: dict[int, Gpu] = {}
    for s in series:
        facts, digits = s.get("facts"), s["subject"][3:]
        if s["name"] != "watch.telemetry" or not facts or not digits.isdigit():
            continue
        gpu = Gpu(index=int(digits), name=facts.get("name"), uuid=facts.get("uuid"), memory_total_mib=facts.get("memory_total_mib"))
        gpu.pcie.bus_id = facts.get("bus_id")
        gpu.clocks.max_sm_mhz = facts.get("max_sm_mhz")
        gpu.thermal.slowdown_c = facts.get("slowdown_c")
        gpu.power.enforced_limit_w = facts.get("power_limit_w")
        gpu.power.default_limit_w = facts.get("default_power_limit_w")
        gpu.power.min_limit_w = facts.get("min_power_limit_w")
        gpu.power.max_limit_w = facts.get("max_power_limit_w")
        gpus[gpu.index] = gpu
    host = Host(hostname=header.get("hostname"))
    host_facts = (header.get("series", {}).get("host") or {}).get("facts") or {}
    for name, value in host_facts.items():
        if hasattr(host, name):
            setattr(host, name, value)
    # A watch of a replayed capture says so ("watch of replay: FILE"), never passing for a live machine.
    source = f"watch of {header['source']}" if header.get("source", "live") != "live" else "watch"
    return Machine(source=source, gpus=[gpus[i] for i in sorted(gpus)], host=host,
                   driver=Driver(version=header.get("driver_version")), gpu_error=header.get("gpu_error"))


def load_record(path: str) -> RunRecord:
    """A run record file; RecordError (one line) for anything else."""
    return load(path, (RUN,)).runs()[0]
