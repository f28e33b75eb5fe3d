"""The live monitor: gpuvet watch."""

from __future__ import annotations

import sys

import click

from ..console import HAVE_RICH, RICH_MISSING
from .base import UsageProblem, cli


@cli.command("watch")
@click.option("--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True, metavar="S",
              help="Seconds between refreshes.")
@click.option("--pid", type=int, metavar="PID", help="Follow one job: the process and its children.")
@click.option("--once", is_flag=True, help="One snapshot, then exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: the snapshot as JSON.")
@click.option("--log", "log_path", metavar="FILE", help="Append JSON lines (gpuvet report can plot them later).")
@click.option("--prometheus", metavar="[HOST:]PORT", help="Serve /metrics for Prometheus (default host 127.0.0.1; a host alone listens on port 9400, dcgm-exporter's).")
@click.option("--no-ui", is_flag=True, help="No live view; print a line when a diagnosis changes (servers, containers).")
def watch_cmd(interval: float, pid: int | None, once: bool, as_json: bool, log_path: str | None,
              prometheus: str | None, no_ui: bool) -> None:
    """Live view of a running job: GPUs, host, and why it is slow."""
    if not HAVE_RICH:
        raise UsageProblem(f"gpuvet watch draws with {RICH_MISSING}")
    from .. import watch

    sys.exit(watch.watch(interval_s=interval, pid=pid, once=once, as_json=as_json, log_path=log_path,
                         prometheus=prometheus, ui=not no_ui))
