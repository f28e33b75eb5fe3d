"""Rendering stored records and answering symptoms: report, doctor."""

from __future__ import annotations

import click
from rich.console import Console

from .. import doctor as doctor_module
from .. import runner
from ..probe.errors import CaptureError
from ..store import StoreError
from .base import UsageProblem, check_out_path, cli, load_run_file, show_record, write_atomically


@cli.command()
@click.argument("path", metavar="RUN.json")
@click.option("--format", "fmt", type=click.Choice(["terminal", "md", "html", "json"]), default="terminal", show_default=True)
@click.option("--out", metavar="FILE", help="Write the report to FILE instead of printing it.")
@click.option("--redact", is_flag=True, help="Remove hostnames, serials, UUIDs and IP/MAC addresses (to share publicly).")
@click.option("-v", "--verbose", is_flag=True, help="List every finding, passes included.")
def report(path: str, fmt: str, out: str | None, redact: bool, verbose: bool) -> None:
    """Render a run record or `gpuvet export` file (judged again with this version's rules), or a
    `gpuvet watch --log` file."""
    check_out_path(out)
    if _is_cluster_record(path):
        _cluster_report(path, fmt, out, verbose, redact)
        return
    if fmt == "terminal" and out:
        raise UsageProblem("--out needs --format md, html or json")
    try:
        record = runner.load_watch_log(path) or runner.rejudge(load_run_file(path))
    except CaptureError as err:
        raise UsageProblem(str(err)) from None
    show_record(record, fmt, out, redact, verbose)


@cli.command()
@click.argument("symptom", required=False, metavar='["SYMPTOM"]')
@click.option("--run", "run_path", metavar="FILE", help="Answer from this run record (default: the latest stored run).")
@click.option("--db", metavar="PATH", help="The history database to take the latest run from.")
def doctor(symptom: str | None, run_path: str | None, db: str | None) -> None:
    """From a symptom ("slower and slower", "no kernel image") to its likely causes and the checks that tell them apart."""
    console = Console(highlight=False, soft_wrap=True)
    if not symptom:
        doctor_module.render_doctor(console)
        return
    found = doctor_module.find_symptom(symptom)
    if found is None:
        doctor_module.render_doctor(console)
        raise UsageProblem(f"unknown symptom {symptom!r}: pick one of those listed above")
    doctor_module.render_doctor(console, doctor_module.diagnose(found, _record_for_doctor(run_path, db)))


def _record_for_doctor(run_path: str | None, db: str | None):
    if run_path:
        try:
            return runner.rejudge(runner.load_record(run_path))
        except CaptureError as err:
            raise UsageProblem(str(err)) from None
    try:
        from ..store import Store

        with Store(db, create=False) as store:
            latest = store.latest()
        return runner.rejudge(latest) if latest else None
    except StoreError:
        return None  # no history yet: answer with the checks to run


def _is_cluster_record(path: str) -> bool:
    from ..cluster import CLUSTER_SCHEMA

    try:
        with open(path, "rb") as f:
            return CLUSTER_SCHEMA.encode() in f.read(512)
    except OSError:
        return False


def _cluster_report(path: str, fmt: str, out: str | None, verbose: bool, redact: bool) -> None:
    """A cluster record (gpuvet cluster --out): one line per node, stragglers, cross-node verdict."""
    import json

    from ..cluster import rejudge_cluster
    from ..report import cluster_view

    try:
        with open(path, encoding="utf-8") as f:
            data = rejudge_cluster(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageProblem(f"{path}: not a readable gpuvet cluster record ({err})") from None
    if redact:
        data = cluster_view.redact_cluster(data)
    if fmt == "terminal":
        if out:
            raise UsageProblem("--out needs --format md, html or json")
        cluster_view.render(data, Console(highlight=False, soft_wrap=True), verbose)
        return
    render = {"json": cluster_view.to_json, "md": lambda d: cluster_view.render_markdown(d, verbose=True),
              "html": lambda d: cluster_view.render_html(d, verbose=True)}[fmt]
    text = render(data)
    if out:
        write_atomically(out, text)
    else:
        click.echo(text)
