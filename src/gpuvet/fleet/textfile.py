"""`gpuvet health --textfile DIR`: the health run as Prometheus gauges in DIR/gpuvet.prom, for
node_exporter's textfile collector (`--collector.textfile.directory DIR`), the standard way a
periodic checker reports to Prometheus.

The file is written whole or not at all (prometheus_client writes a temporary file beside it and
renames it over the old one), so a scrape never reads half a run. Every series is rewritten at
each run: a check that stops failing is 1 again, a GPU gone from the node leaves no stale series.

Series (labels as dcgm-exporter's where they name a GPU: gpu is its index, UUID its UUID):
  gpuvet_health_status{status}            1 for the node's answer (healthy / problem / unknown), 0 for the others
  gpuvet_health_action{action}            1 for the worst action any finding asks for, 0 for the others
  gpuvet_health_action_rank               that action's place in gpuvet.actions (0 none .. 7 drain_and_repair)
  gpuvet_health_check_ok{check,subject,gpu,UUID,status,action}
                                          1 a check passed or warned, 0 it failed (its action is the label)
  gpuvet_health_check_unread{check,subject}
                                          1 a check that could not be judged (never a silent pass)
  gpuvet_health_gpu_ok{gpu,UUID,pci_bus_id,model,action}
                                          1 no check failed on this GPU, 0 one did (action: the worst asked for it)
  gpuvet_health_last_run_timestamp_seconds, gpuvet_health_duration_seconds, gpuvet_health_info{version,summary}
"""

from __future__ import annotations

import os
from typing import Iterator

from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import GaugeMetricFamily, Metric

from .. import actions
from ..record import FAIL, SKIP, RunRecord, parse_timestamp
from ..record.verdict import OUTCOMES

FILE_NAME = "gpuvet.prom"  # node_exporter reads *.prom only: the temporary file beside it is ignored


def metrics(record: RunRecord, outcome: str) -> list[Metric]:
    """The health run as metric families (what the file holds)."""
    gpus = {f"gpu{g.index}": g for g in record.machine.gpus}

    status = GaugeMetricFamily("gpuvet_health_status", "The node's health by gpuvet health: 1 for its answer "
                               "(healthy, problem, unknown: could not tell), 0 for the others.", labels=["status"])
    for name in OUTCOMES:
        status.add_metric([name], 1.0 if name == outcome else 0.0)

    worst = record.action
    action = GaugeMetricFamily("gpuvet_health_action", "The most disruptive action any finding asks for "
                               "(gpuvet.actions): 1 for it, 0 for the others.", labels=["action"])
    for name in actions.NAMES:
        action.add_metric([name], 1.0 if name == worst else 0.0)
    rank = GaugeMetricFamily("gpuvet_health_action_rank", "The worst action's place in gpuvet.actions: 0 none, "
                             + ", ".join(f"{i} {n}" for i, n in enumerate(actions.NAMES) if i) + ".",
                             value=float(actions.rank(worst)))

    check_ok = GaugeMetricFamily("gpuvet_health_check_ok", "1 when the check passed or warned on its subject, 0 when "
                                 "it failed; action: what a remediator does about it.",
                                 labels=["check", "subject", "gpu", "UUID", "status", "action"])
    unread = GaugeMetricFamily("gpuvet_health_check_unread", "1 for each check that could not be judged on its "
                               "subject (a field it needs could not be read, or --skip).", labels=["check", "subject"])
    failed_on: dict[str, list[str]] = {}
    for f in record.findings:
        if f.status == SKIP:
            unread.add_metric([f.check, f.subject], 1.0)
            continue
        gpu = gpus.get(f.subject)
        check_ok.add_metric([f.check, f.subject, str(gpu.index) if gpu else "", (gpu.uuid or "") if gpu else "",
                             f.status, f.action or actions.NONE], 0.0 if f.status == FAIL else 1.0)
        if f.status == FAIL:
            failed_on.setdefault(f.subject, []).append(f.action or actions.NONE)

    gpu_ok = GaugeMetricFamily("gpuvet_health_gpu_ok", "1 when no check failed on this GPU, 0 when one did; action: "
                               "the worst its failures ask for.", labels=["gpu", "UUID", "pci_bus_id", "model", "action"])
    for subject, g in gpus.items():
        failures = failed_on.get(subject, [])
        gpu_ok.add_metric([str(g.index), g.uuid or "", g.pcie.bus_id or "", g.name or "", actions.worst(failures)],
                          0.0 if failures else 1.0)

    try:
        started = parse_timestamp(record.started_at).timestamp()
    except ValueError:
        started = float("nan")
    when = GaugeMetricFamily("gpuvet_health_last_run_timestamp_seconds", "When the health check ran (Unix time): "
                             "an old value means the check stopped running.", value=started)
    duration = GaugeMetricFamily("gpuvet_health_duration_seconds", "How long the health check took.",
                                 value=round(record.duration_s, 3))
    info = GaugeMetricFamily("gpuvet_health_info", "The gpuvet version and the summary line of the last check.",
                             labels=["version", "summary"])
    info.add_metric([str(record.tool.get("version", "")), str(record.options.get("summary") or "")], 1.0)
    return [status, action, rank, check_ok, unread, gpu_ok, when, duration, info]


class _Run:
    """A collector that yields one health run's families."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def write(directory: str, record: RunRecord, outcome: str) -> str:
    """DIR/gpuvet.prom, replaced atomically; returns its path. OSError when it cannot be written."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Run(metrics(record, outcome)))
    path = os.path.join(directory, FILE_NAME)
    write_to_textfile(path, registry)
    return path
