"""`gpuvet health`: the passive check schedulers run on every node (Slurm HealthCheckProgram,
Kubernetes node-problem-detector). Exit 0 healthy, 1 a problem, 2 could not tell."""

from __future__ import annotations

import json
import os
import sys
import threading

import click

from ..fleet import health as fleet_health
from ..fleet import kubernetes, slurm
from .. import actions, catalog
from ..record.verdict import EXIT_CODES, HEALTHY, PROBLEM, UNKNOWN
from ..probe import live
from ..probe.errors import CaptureError
from ..record import RunRecord
from ..store import Store, StoreError
from ..report.health import detail_lines, summary_line, verdict
from ..report.node_labels import node_labels
from ..judge.gpu_xid import HEALTH_WINDOW_S, duration_text
from .base import UsageProblem, check_out_path, cli, load_run_file, save, write_atomically, xid_window_option

TEXTFILE_NAME = "gpuvet.prom"  # fleet/textfile.py's FILE_NAME (a test holds them equal)
SAVE_BUDGET_S = 1.0  # the history row must not hold the answer up (another gpuvet may hold the store)


@cli.command()
@click.option("--slurm", "use_slurm", is_flag=True,
              help="Drain this Slurm node on a problem (reason: the summary line) and resume it once healthy, "
                   "only when gpuvet drained it.")
@click.option("--node", metavar="NAME", help="This node's Slurm name (default: $SLURMD_NODENAME, else the short host name); "
                                             "with --taint, its Kubernetes name (default: $NODE_NAME).")
@click.option("--taint", "taint_from", type=click.Choice(actions.NAMES[1:]), envvar="GPUVET_TAINT", metavar="ACTION",
              help=f"Kubernetes, opt-in: taint this node {kubernetes.TAINT_KEY}=<action>:{kubernetes.TAINT_EFFECT} when "
                   "the worst action asked for is ACTION or more disruptive, and take the taint off once it is not "
                   "(from inside a pod; $GPUVET_TAINT). One of: " + ", ".join(actions.NAMES[1:]) + ".")
@click.option("--expect-gpus", type=click.IntRange(min=0), metavar="N",
              help="The node has N GPUs: fewer visible is a problem (a GPU gone from the bus leaves no trace).")
@click.option("--gpu-deadline", type=click.FloatRange(min=0.1, max=60), default=live.HEALTH_BUDGETS_S["gpu"],
              show_default=True, metavar="S",
              help="Seconds NVML may take before the GPU probe counts as hung (a finding, exit 1).")
@click.option("--skip", "skipped", multiple=True, type=click.Choice(sorted(catalog.at_level(catalog.HEALTH))), metavar="CHECK",
              help="Leave this check out (repeatable), e.g. gpu.power_limit on a fleet capped on purpose.")
@xid_window_option(duration_text(HEALTH_WINDOW_S).replace(" ", ""),
                   f"{duration_text(HEALTH_WINDOW_S)}, as Azure's health checks judge Xids, so a reset GPU stops failing")
@click.option("--from", "captures", multiple=True, metavar="FILE",
              help="Judge these captures (nvidia-smi -q -x, -q, ...) instead of this node's GPUs (repeatable).")
@click.option("--brief", is_flag=True, help="Print the summary line only (node-problem-detector keeps 80 bytes).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the verdict as one JSON object instead (schema gpuvet.health/1: `gpuvet schema health`): "
                   "status, action, the GPUs affected, every finding with its action, what could not be read.")
@click.option("--out", metavar="FILE", help="Also write the whole run record (facts and findings) to FILE.")
@click.option("--textfile", "textfile_dir", metavar="DIR",
              help=f"Also write the verdict as Prometheus gauges to DIR/{TEXTFILE_NAME}, atomically, for "
                   "node_exporter's textfile collector: per check and per GPU, the worst action, when it ran.")
@click.option("-v", "--verbose", is_flag=True, help="List every finding, passes included.")
@click.option("--keep", type=click.Choice(["every", "changes"]), default="every", show_default=True,
              help="changes: keep a run in the history only when its summary changed, or hourly (for schedulers).")
@click.option("--no-save", is_flag=True, help="Do not keep this check in the local history.")
@click.option("--db", metavar="PATH", help="The history database (default: $GPUVET_DB or ~/.local/share/gpuvet).")
def health(use_slurm: bool, node: str | None, taint_from: str | None, expect_gpus: int | None, gpu_deadline: float, skipped: tuple[str, ...],
           xid_window: float, captures: tuple[str, ...], brief: bool, as_json: bool, out: str | None,
           textfile_dir: str | None, verbose: bool, keep: str, no_save: bool, db: str | None) -> None:
    """Passive GPU health of this node in under 5 s: no load, no benchmark, nothing written but its
    history row. First line: a summary short enough for a drain reason. Exit 0 healthy, 1 a
    problem, 2 could not tell (node-problem-detector's OK / NonOK / Unknown)."""
    check_out_path(out)
    if textfile_dir and not os.path.isdir(textfile_dir):
        raise UsageProblem(f"--textfile {textfile_dir}: no such folder (node_exporter's --collector.textfile.directory)")
    try:
        record = fleet_health.check(captures=list(captures) or None, expect_gpus=expect_gpus,
                                    budgets_s={"gpu": gpu_deadline}, skip=list(skipped), xid_window_s=xid_window or None)
    except CaptureError as err:
        raise UsageProblem(str(err)) from None
    outcome = fleet_health.outcome(record)
    summary = summary_line(record, outcome)
    record.options["summary"] = summary
    if not no_save:
        _save_bounded(record, db, only_changes=keep == "changes")
    if out:
        write_atomically(out, record.to_json() + "\n")
    if textfile_dir:
        _textfile(textfile_dir, record, outcome)
    if as_json:
        click.echo(json.dumps(verdict(record, outcome), indent=2))
    else:
        click.echo(summary)
        if not brief:
            from ..report import terminal  # wrapped to a terminal under their columns; whole to a pipe

            terminal.print_columns(terminal.stdout_console(), detail_lines(record, verbose))
    if use_slurm:
        _slurm(outcome, summary, node)
    if taint_from:
        _taint(outcome, record.action, taint_from, node)
    sys.exit(EXIT_CODES[outcome])


def _save_bounded(record: RunRecord, db: str | None, only_changes: bool) -> None:
    saver = threading.Thread(target=_save, args=(record, db, only_changes), daemon=True)
    saver.start()
    saver.join(SAVE_BUDGET_S)
    if saver.is_alive():
        click.echo(f"gpuvet: warning: history not saved within {SAVE_BUDGET_S:g} s (the store is busy)", err=True)


def _save(record: RunRecord, db: str | None, only_changes: bool) -> None:
    if only_changes:
        try:
            with Store(db, create=False) as store:
                if not fleet_health.worth_keeping(store, record):
                    return
        except StoreError:  # no history yet, or unreadable: save() creates it or says why
            pass
    save(record, db, False, None, None)


def _textfile(directory: str, record: RunRecord, outcome: str) -> None:
    """One line on stderr when the file cannot be written; the exit code stays the health answer."""
    from ..fleet import textfile  # prometheus_client, only when asked: every other command runs without it

    try:
        textfile.write(directory, record, outcome)
    except OSError as err:
        click.echo(f"gpuvet: --textfile {directory}: cannot write {TEXTFILE_NAME} ({err.strerror or err})", err=True)


def _taint(outcome: str, action: str, taint_from: str, node: str | None) -> None:
    """--taint: gpuvet's taint carries the worst action while it is at least `taint_from`; a healthy
    node (or a lesser action) loses it; a node that could not be read keeps what it has. One line
    on stderr either way; the exit code stays the health answer."""
    name = node or os.environ.get("NODE_NAME")
    if outcome == UNKNOWN:
        click.echo(f"gpuvet: kubernetes: could not tell the GPUs' health: node {name or '?'}'s taint left as it is", err=True)
        return
    value = action if outcome == PROBLEM and actions.rank(action) >= actions.rank(taint_from) else None
    try:
        if not name:
            raise kubernetes.KubernetesError("no node name: set NODE_NAME (the downward API's spec.nodeName) or --node")
        line = kubernetes.set_taint(kubernetes.in_cluster(), name, value)
    except kubernetes.KubernetesError as err:
        line = f"node {name or '?'} not {'tainted' if value else 'untainted'}: {err}"
    click.echo(f"gpuvet: kubernetes: {line}", err=True)


def _slurm(outcome: str, summary: str, node: str | None) -> None:
    """The scheduler's part: one line on stderr either way; the exit code stays the health answer."""
    name = slurm.node_name(node)
    try:
        line = slurm.apply(outcome, summary, name)
    except slurm.SlurmError as err:
        verb = {PROBLEM: "drained", HEALTHY: "resumed"}.get(outcome, "changed")
        line = f"slurm: {name} not {verb}: {err}"
    click.echo(f"gpuvet: {line}", err=True)


@cli.command(name="node-labels")
@click.argument("record_file", metavar="RUN.json")
@click.option("--apply", "node", metavar="NODE", help="Label this Kubernetes node (from inside a pod, with its service account).")
@click.option("--json", "as_json", is_flag=True, help="Print the labels as one JSON object.")
def node_labels_command(record_file: str, node: str | None, as_json: bool) -> None:
    """A run record's verdict, kind, GPU count, model and power cap as Kubernetes node labels
    (gpuvet.dev/...): printed as key=value lines, or put on NODE with --apply."""
    try:
        labels = node_labels(load_run_file(record_file))
    except CaptureError as err:
        raise UsageProblem(str(err)) from None
    if as_json:
        click.echo(json.dumps(labels, indent=2))
    else:
        for key, value in labels.items():
            click.echo(f"{key}={value}")
    if node:
        try:
            kubernetes.label_node(kubernetes.in_cluster(), node, labels)
        except kubernetes.KubernetesError as err:
            raise UsageProblem(str(err)) from None
        click.echo(f"gpuvet: labelled node {node}", err=True)
