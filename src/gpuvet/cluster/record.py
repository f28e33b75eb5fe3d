"""The cluster record (gpuvet.cluster/1): what a node ships to rank 0, the cross-node results as
measurements, the judged record, a saved record judged again, and the record on disk (--out)."""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any

from .. import __version__
from ..bench.allreduce import LATENCY_BYTES
from ..judge.cluster import (ALLREDUCE_BUSBW, ALLREDUCE_LATENCY, FAILED, FALLBACK, METRICS, MISSING, NOTE, OK, RING,
                             STOPPED, UNNAMED_PREFIX, NodeEntry, judge_cluster, name_list, starting_up)
from ..record import FAIL, WARN, Measurement, verdict_of
from ..record.cluster import CLUSTER_SCHEMA
from .launch import Launch
from .options import Options
from .cross_rank import FINISHED, step_progress
from .plan import Plan
from .roster import NodeState, Settled



# == what a node ships: its record, time series summarised ===================================

def summarise_series(series: dict[str, Any]) -> dict[str, Any]:
    """A time series as min/median/max/first/last per column instead of every row."""
    columns, rows = series.get("columns") or [], series.get("rows") or []
    stats = {}
    for i, column in enumerate(columns):
        values = [row[i] for row in rows if i < len(row) and isinstance(row[i], (int, float))]
        if column != "t" and values:
            stats[column] = {"min": min(values), "median": statistics.median(values), "max": max(values),
                             "first": values[0], "last": values[-1]}
    return {"name": series.get("name"), "subject": series.get("subject"), "interval_s": series.get("interval_s"),
            "rows": len(rows), "stats": stats}


def summarise_record(record: dict[str, Any], whole: bool = False) -> dict[str, Any]:
    """The run record a node ships to rank 0 (and the cluster record keeps): what judging the
    cluster reads of it (its verdict and action, the facts the nodes are compared on, the figures
    stragglers are found in, its failures and warnings), still a gpuvet.run/1 record. About 5 KB
    on an 8-GPU node against 80 KB whole: at 4,000 nodes the gather and the cluster record stay
    small. The whole record lives on in the node's own store (`gpuvet show ID` there, the node's
    saved_run); `whole` (--full-records) ships it all, time series included."""
    if whole:
        return record
    machine = record.get("machine") or {}
    findings = [{k: f.get(k) for k in _FINDING_KEPT if k in f} for f in record.get("findings") or ()
                if f.get("status") in (FAIL, WARN)]
    figures = [{"name": m["name"], "value": _significant(m.get("value")), "unit": m.get("unit"), "subject": m.get("subject")}
               for m in record.get("measurements") or () if m.get("name") in METRICS]
    summary = {k: record[k] for k in _RECORD_KEPT if k in record}
    summary.update(machine=_machine_summary(machine), measurements=figures, findings=findings, series=[],
                   options={k: v for k, v in (record.get("options") or {}).items() if k in _OPTIONS_KEPT})
    return summary


# What the cluster's judge and report read of a node's record (judge/cluster/nodes.py), and no more.
_RECORD_KEPT = ("schema", "tool", "started_at", "duration_s", "source", "verdict", "action")
_OPTIONS_KEPT = ("profile", "device", "benchmarks", "cluster", "label")
_FINDING_KEPT = ("check", "subject", "status", "summary", "action")
_GPU_KEPT = ("index", "name", "uuid", "vbios", "memory_total_mib", "memory_used_mib", "memory_reserved_mib", "pstate",
             "utilization_pct", "processes")
FIGURE_DIGITS = 5  # significant digits a shipped figure keeps: far finer than any straggler threshold (5%)


def _significant(value: Any) -> Any:
    return float(f"{value:.{FIGURE_DIGITS}g}") if isinstance(value, float) else value


def _machine_summary(machine: dict[str, Any]) -> dict[str, Any]:
    torch = ((machine.get("stack") or {}).get("torch") or {})
    host = machine.get("host") or {}
    gpus = []
    for g in machine.get("gpus") or ():
        power, pcie = g.get("power") or {}, g.get("pcie") or {}
        gpu = {k: g[k] for k in _GPU_KEPT if k in g}
        gpu["power"] = {k: power[k] for k in ("enforced_limit_w", "limit_w") if k in power}
        gpu["pcie"] = {k: pcie[k] for k in ("bus_id", "readings") if k in pcie}
        gpu["clocks"] = {"event_reasons": (g.get("clocks") or {}).get("event_reasons")}
        gpus.append(gpu)
    out: dict[str, Any] = {"gpus": gpus, "driver": {k: v for k, v in (machine.get("driver") or {}).items()
                                                     if k in ("version", "cuda_version")}}
    if machine.get("stack") is not None:
        out["stack"] = {"torch": {k: torch[k] for k in ("installed", "version", "cuda", "nccl") if k in torch}}
    if machine.get("host") is not None:
        out["host"] = {k: host[k] for k in ("hostname", "nics", "rdma") if k in host}
    for key in ("source", "gpu_error"):
        if key in machine:
            out[key] = machine[key]
    return out


# == rank 0: the cluster record ==============================================================

def cross_measurements(plan: Plan | None, nodes: list[NodeState], skipped: str | None = None) -> list[Measurement]:
    """The cross-node results of every member as measurements: the all-reduce sweep (from the
    first member that has it) and one transfer per ring pair; a `bench.cluster` note for what
    could not be measured, naming the nodes that stopped it."""
    if plan is None:
        return [_note("skipped", skipped or "not measured")]
    by_rank = {n.rank: n for n in nodes}
    members = [by_rank[r] for r in plan.members]
    measurements: list[Measurement] = []
    rows = next((m.cross["allreduce"] for m in members if m.cross and m.cross.get("allreduce")), None)
    if rows:
        measurements += _allreduce_measurements(plan, rows)
    for member in members:
        for entry in (member.cross or {}).get("ring") or []:
            measurements.append(_ring_measurement(plan, member.name, entry))
    problem = _cross_problem(plan, members)
    if problem:
        measurements.append(_note(*problem))
    if plan.without_gpu:
        measurements.append(Measurement(FALLBACK, None, "", "cluster", {"backend": plan.backend, "device": plan.device,
                                                                        "without_gpu": plan.without_gpu}))
    return measurements


def _allreduce_measurements(plan: Plan, rows: list[dict[str, Any]]) -> list[Measurement]:
    largest = rows[-1]
    world_size = len(plan.members) * plan.ranks_per_node
    common = {"members": plan.names, "ranks_per_node": plan.ranks_per_node, "world_size": world_size,
              "backend": plan.backend, "device": plan.device}
    latency_row = next((r for r in rows if r["bytes"] == LATENCY_BYTES), rows[0])
    return [
        Measurement(ALLREDUCE_LATENCY, latency_row["time_us"], "us", "cluster",
                    {"bytes": latency_row["bytes"], "iterations": latency_row["iterations"], **common}),
        Measurement(ALLREDUCE_BUSBW, largest["busbw_gbps"], "GB/s", "cluster",
                    {"largest_bytes": largest["bytes"], "algbw_gbps": largest["algbw_gbps"], "time_us": largest["time_us"],
                     "sizes": rows, "check_ok": all(r["wrong"] == 0 for r in rows), **common,
                     "formula": "algbw = bytes / time / 1e9; busbw = algbw * 2(n-1)/n (nccl-tests)"}),
    ]


def _ring_measurement(plan: Plan, receiver: str, entry: dict[str, Any]) -> Measurement:
    src = plan.names[entry["src_member"]]
    details = {"src": src, "dst": receiver, "round": entry["round"], "backend": plan.backend,
               "ranks_per_node": plan.ranks_per_node}
    if entry.get("error") or not entry.get("seconds"):
        return Measurement(RING, None, "GB/s", f"{src}->{receiver}", {**details, "error": entry.get("error", "no time")})
    gbps = entry["bytes"] / entry["seconds"] / 1e9
    return Measurement(RING, gbps, "GB/s", f"{src}->{receiver}",
                       {**details, "bytes": entry["bytes"], "seconds": entry["seconds"], "wrong": entry["wrong"]})


Problem = tuple[str, str, list[str], dict[str, Any]]  # (outcome, reason, nodes named, details)


@dataclass
class _Trouble:
    """What went wrong in the cross-node step, gathered from the members' reports."""

    silent: list[str]  # members that sent no result
    aborted: str | None  # why rank 0 stopped everyone (or the deadline passed)
    errors: list[tuple[str, dict[str, Any]]]  # (member, rank error)
    behind: dict[str, str]  # members whose slowest rank stopped earlier than the others -> that step
    reached: str | None  # the step the others reached

    @property
    def behind_words(self) -> str:
        if not self.behind:
            return ""
        others = "finished" if self.reached == FINISHED else f"reached {self.reached}"
        stops = ", ".join(f"{name} stopped at {step}" for name, step in list(self.behind.items())[:8])
        return f"; {stops} while the others {others}"

    @property
    def extra(self) -> dict[str, Any]:
        return {"behind": self.behind, "others_reached": self.reached} if self.behind else {}

    @property
    def named(self) -> list[str]:
        return self.silent + [name for name in self.behind if name not in self.silent]


def _cross_problem(plan: Plan, members: list[NodeState]) -> Problem | None:
    trouble = _trouble(members)
    if trouble is None:
        return None
    return (_only_slow_to_start(plan, trouble)
            or (("aborted", f"aborted: {trouble.aborted}{trouble.behind_words}", trouble.named, trouble.extra)
                if trouble.aborted else None)  # who was behind says who held the others up
            or _failed(members, trouble))


def _trouble(members: list[NodeState]) -> _Trouble | None:
    silent = [m.name for m in members if m.cross is None]
    aborted = next((m.cross["aborted"] for m in members if m.cross and m.cross.get("aborted")), None)
    errors = [(m.name, e) for m in members if m.cross for e in m.cross.get("errors") or []]
    if not (silent or aborted or errors):
        return None
    return _Trouble(silent, aborted, errors, *members_behind(members))


def _only_slow_to_start(plan: Plan, trouble: _Trouble) -> Problem | None:
    """Held up only by ranks still starting (Python, import torch): a loaded node, not a broken one.
    Not measured (skipped), never failed; the slow nodes named (all, if none was behind)."""
    broken = [e for _, e in trouble.errors if not e.get("stopped")]
    # Who held the others up: the nodes behind, or (all at one step) every stopped rank.
    held_at = list(trouble.behind.values()) if trouble.behind else [e.get("step") for _, e in trouble.errors]
    if not (trouble.aborted and held_at and not trouble.silent and not broken and all(starting_up(s) for s in held_at)):
        return None
    slow = trouble.behind or {name: e.get("step") or "starting" for name, e in trouble.errors}
    return ("skipped", f"not measured: the cross-node ranks of {name_list(list(slow))} did not start within "
                       f"{plan.start_timeout_s:.0f} s{trouble.behind_words} (a loaded machine? see `uptime` there); rerun "
                       "on idle nodes or with a longer --start-timeout", list(slow),
            {**trouble.extra, "behind": slow, "start_timeout_s": plan.start_timeout_s})


def _failed(members: list[NodeState], trouble: _Trouble) -> Problem:
    parts = []
    if trouble.silent:
        why = "; ".join(f"{m.name}: {m.reason}" for m in members if m.cross is None and m.reason)
        parts.append(f"no result from {', '.join(trouble.silent[:8])}" + (f" ({why})" if why else ""))
    if trouble.errors:
        name, error = trouble.errors[0]
        more = len(trouble.errors) - 1
        parts.append(f"on {name} during {error.get('step')}: {error.get('error')}"
                     + (f" (and {more} more rank errors)" if more else ""))
    return "failed", "; ".join(parts) + trouble.behind_words, trouble.named, trouble.extra


def members_behind(members: list[NodeState]) -> tuple[dict[str, str], str | None]:
    """The members whose slowest rank stopped at an earlier step than the others reached (name ->
    that step), and the step the others reached. In a collective every rank waits for the last
    one: a node stuck importing torch or inside a hung NCCL call is the one behind."""
    last: dict[str, str | None] = {}
    for m in members:
        if m.cross is None:
            continue
        steps = m.cross.get("steps") or [e.get("step") for e in m.cross.get("errors") or []]
        if steps:
            last[m.name] = min(steps, key=step_progress)
    if len(last) < 2:
        return {}, None
    furthest = max(last.values(), key=step_progress)
    slowest = min(step_progress(s) for s in last.values())
    if slowest == step_progress(furthest):
        return {}, None
    behind = {name: step or "starting" for name, step in last.items() if step_progress(step) == slowest}
    return behind, furthest


def _note(outcome: str, reason: str, nodes: list[str] | None = None, extra: dict[str, Any] | None = None) -> Measurement:
    return Measurement(NOTE, None, "", "cluster", {"outcome": outcome, "reason": reason, "nodes": nodes or [], **(extra or {})})


def node_entries(nodes: list[NodeState], records: dict[int, dict[str, Any]], saved: dict[int, int | None],
                 absent: Settled | list[str] | None = None, source: str = "--nodes",
                 stopped: str | None = None, stopped_after_s: float | None = None) -> list[NodeEntry]:
    """One entry per rank, and one per expected node that no rank answered for (`absent`: named
    from the node list, `source`, or only counted). `stopped`: the run ended early, for that
    reason, `stopped_after_s` after it started."""
    settled = absent if isinstance(absent, Settled) else Settled(list(absent or []))
    entries = []
    after = f" after {stopped_after_s:.0f} s" if stopped_after_s is not None else ""
    for n in nodes:
        status = OK if n.state in ("ready", "done") else MISSING if n.state in (MISSING, "waiting") else FAILED
        if n.state == "waiting":  # not joined yet: the run was stopped within the join timeout
            n.reason = n.reason or (f"had not joined when the run stopped{after}" if stopped else "it never joined")
        if n.state == "joined" and stopped:  # alive, not ready yet: the stop cut its vet short, not a fault
            status = STOPPED
            n.reason = n.reason or f"still at {n.step or 'its local vet'} when the run was stopped{after}"
        elif n.state == "joined":  # alive but never ready: the plan went on without it
            status = FAILED
            n.reason = n.reason or "not ready when the others met"
        entries.append(NodeEntry(n.name, n.rank, status, n.reason, n.step, n.host, records.get(n.rank), saved.get(n.rank)))
    started = f"the launcher started the job with {len(nodes)} node{'' if len(nodes) == 1 else 's'}"
    for name in settled.absent:
        entries.append(NodeEntry(name, None, MISSING, f"it never joined: named in {source}, but {started} without it"))
    unmatched = (f"; the names {', '.join(settled.unmatched[:8])} in {source} match no joined node's name or address"
                 if settled.unmatched else "")
    for i in range(settled.unnamed):
        entries.append(NodeEntry(f"{UNNAMED_PREFIX}{i + 1}", None, MISSING,
                                 f"it never joined: {len(nodes) + len(settled.absent) + settled.unnamed} nodes expected, "
                                 f"{started}{unmatched}", unnamed=True))
    return entries


def cluster_record(launch: Launch, options: Options, started_at: str, duration_s: float, entries: list[NodeEntry],
                   plan: Plan | None, measurements: list[Measurement], stopped: str | None = None) -> dict[str, Any]:
    """The judged cluster record; `stopped`: why the run ended before its end (the record holds
    what was gathered by then)."""
    judgement = judge_cluster(entries, measurements, {"tolerance": options.tolerance, "stopped": stopped})
    record = {
        "schema": CLUSTER_SCHEMA,
        "tool": {"name": "gpuvet", "version": __version__},
        "cluster_id": launch.cluster_id,
        "started_at": started_at,
        "duration_s": round(duration_s, 3),
        "launcher": {"kind": launch.kind, "world_size": launch.world_size,
                     "master": f"{launch.master_addr}:{launch.master_port}"},
        "options": _recorded_options(options),
        "nodes": [_entry_dict(e) for e in sorted(entries, key=lambda e: (e.rank is None, e.rank or 0))],
        "cross_node": {"plan": asdict(plan) if plan else None, "measurements": [asdict(m) for m in measurements]},
        "summary": {"rows": [asdict(r) for r in judgement.rows], "baselines": [asdict(b) for b in judgement.baselines],
                    "stragglers": [asdict(s) for s in judgement.stragglers],
                    "uniformity": [asdict(u) for u in judgement.uniformity]},
        "findings": [asdict(f) for f in judgement.findings],
        "verdict": verdict_of(judgement.findings),
    }
    if stopped:
        record["stopped"] = stopped
    return record


def _entry_dict(entry: NodeEntry) -> dict[str, Any]:
    """asdict() without its deep copy of the node's record (seconds at 1,000 nodes)."""
    return {f: getattr(entry, f) for f in NodeEntry.__dataclass_fields__}


def _recorded_options(options: Options) -> dict[str, Any]:
    keep = ("quick", "device", "benchmarks", "soak_minutes", "preemptible", "expect", "expect_nodes", "tolerance",
            "join_timeout", "vet_timeout",
            "cross_timeout", "start_timeout", "dead_after", "allreduce_max_mib", "ring_mib", "ring_rounds", "cross", "full_records")
    return {k: getattr(options, k) for k in keep if getattr(options, k) not in (None, [], False)}


def rejudge_cluster(record: dict[str, Any], tolerance: float | None = None) -> dict[str, Any]:
    """A saved cluster record judged again by this version's rules."""
    entries = [_flat(NodeEntry, n) for n in record.get("nodes") or []]
    cross = record.get("cross_node") or {}
    measurements = [_flat(Measurement, m) for m in cross.get("measurements") or []]
    judgement = judge_cluster(entries, measurements, {"tolerance": tolerance, "stopped": record.get("stopped")})
    again = dict(record)
    again["summary"] = {"rows": [asdict(r) for r in judgement.rows], "baselines": [asdict(b) for b in judgement.baselines],
                        "stragglers": [asdict(s) for s in judgement.stragglers],
                        "uniformity": [asdict(u) for u in judgement.uniformity]}
    again["findings"] = [asdict(f) for f in judgement.findings]
    again["verdict"] = verdict_of(judgement.findings)
    return again


def _flat(cls: type, data: dict[str, Any]) -> Any:
    """A dataclass of plain fields from its dict, unknown keys ignored: facts.from_dict without its
    type-hint walk, which costs a second at 1,000 nodes and converts nothing here."""
    return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


# == the record on disk ======================================================================

def check_out_path(out: str | None) -> str | None:
    """Why --out cannot be written (None: it can): a missing folder, or a file that is not a
    gpuvet cluster record (a typo must not eat the user's files)."""
    if not out:
        return None
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        return f"--out {out}: the folder {folder} does not exist"
    if os.path.isdir(out):
        return f"--out {out}: is a folder; give a file name"
    if os.path.exists(out):
        with open(out, "rb") as f:
            head = f.read(512)
        if head.strip() and CLUSTER_SCHEMA.encode() not in head:
            return f"--out {out}: the file exists and is not a gpuvet cluster record; choose another name"
    return None
