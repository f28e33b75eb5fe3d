"""Rendering stored records and answering symptoms: report, doctor; the catalogue of checks: checks."""

from __future__ import annotations

import json

import click

from .. import doctor as doctor_module
from .. import runner
from ..probe.errors import CaptureError
from ..report import terminal
from ..store import StoreError
from ..record.load import CLUSTER, WATCH, load
from ..record.schema import KINDS as SCHEMA_KINDS
from ..record.schema import shipped as shipped_schema
from .base import UsageProblem, check_out_path, cli, first_run, load_run_file, show_record, write_atomically
from .history import local_clock
from .stored import stored_run, stored_run_id


@cli.command()
@click.argument("path", metavar="RUN")
@click.option("--format", "fmt", type=click.Choice(["terminal", "md", "html", "json"]), default="terminal", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the same as --format json).")
@click.option("--out", metavar="FILE", help="Write the report to FILE instead of printing it.")
@click.option("--redact", is_flag=True, help="Remove hostnames, serials, UUIDs and IP/MAC addresses (to share publicly).")
@click.option("-v", "--verbose", is_flag=True, help="List every finding, passes included.")
@click.option("--db", metavar="PATH", help="The history database a run id is read from.")
@click.option("--utc-offset", type=click.FloatRange(min=-14, max=14), metavar="HOURS",
              help="A watch log's times on this clock (default: this machine's time zone), e.g. 8 for UTC+8.")
@click.option("--for-provider", is_flag=True,
              help="The evidence pack to send the provider (md or html): failing findings first, the GPUs' identity "
                   "kept, your host names, users, addresses and paths removed, the capture lines each rests on.")
def report(path: str, fmt: str, as_json: bool, out: str | None, redact: bool, verbose: bool, db: str | None,
           utc_offset: float | None, for_provider: bool) -> None:
    """Render a stored run (its id, as "saved as run N" gave it), a run record or `gpuvet export`
    file (judged again with this version's rules), a `gpuvet watch --log` file or a cluster record."""
    fmt = "json" if as_json else fmt
    check_out_path(out)
    if for_provider:
        _evidence_pack(path, db, fmt, out)
        return
    if stored_run_id(path) is not None:
        show_record(stored_run(db, path), fmt, out, redact, verbose)
        return
    loaded = load(path)  # RecordError: one line, exit 2
    if loaded.kind == CLUSTER:
        _cluster_report(loaded.data, fmt, out, verbose, redact)
        return
    if fmt == "terminal" and out:
        raise UsageProblem("--out needs --format md, html or json")
    try:
        if loaded.kind == WATCH:  # its text, already read (stdin cannot be read twice)
            record = runner.watch_log_record(loaded.data.encode("utf-8"), loaded.where)
        else:
            record = runner.rejudge(first_run(loaded))
    except CaptureError as err:
        raise UsageProblem(str(err)) from None
    if record is None:  # load() told it a watch log: its header is one
        raise UsageProblem(f"{loaded.where}: not a gpuvet watch log")
    if loaded.kind == WATCH and fmt == "html":  # on the clock (3 a.m., not +10800 s)
        _watch_page(record, local_clock()[0] if utc_offset is None else utc_offset, out, redact)
        return
    show_record(record, fmt, out, redact, verbose)


def _evidence_pack(path: str, db: str | None, fmt: str, out: str | None) -> None:
    """The pack of a stored run or a run record file, with the captures it was made from read again."""
    from .. import catalog
    from ..report import evidence

    if fmt not in ("terminal", "md", "html"):
        raise UsageProblem("--for-provider writes Markdown (the default) or --format html")
    try:
        record = stored_run(db, path) if stored_run_id(path) is not None else runner.rejudge(load_run_file(path))
    except CaptureError as err:
        raise UsageProblem(str(err)) from None
    captures = {entry["path"]: _capture_text(entry["path"]) for entry in record.machine.captures if entry.get("path")}
    pack = evidence.build(record, captures, {c.id: c.benchmark for c in catalog.CHECKS})
    text = evidence.render_html(pack) if fmt == "html" else evidence.render_markdown(pack)
    if out:
        write_atomically(out, text, redacted=True)
        click.echo(f"gpuvet: evidence pack written to {out}", err=True)
    else:
        click.echo(text, nl=False)


def _capture_text(path: str) -> str | None:
    """A capture's text as it is now (None: gone or unreadable), control characters taken out."""
    from ..probe.bounded_read import read_bounded
    from ..untrusted_text import clean_document

    try:
        return clean_document(read_bounded(path).decode("utf-8", errors="replace"))
    except (OSError, CaptureError):
        return None


def _watch_page(record, utc_offset_hours: float, out: str | None, redact: bool) -> None:
    from ..report.html import render_html
    from ..report.redact import redact as redact_record

    page = render_html(redact_record(record) if redact else record, utc_offset_hours=utc_offset_hours)
    if out:
        write_atomically(out, page, redacted=redact)
        click.echo(f"html report written to {out}")
    else:
        click.echo(page, nl=False)


@cli.command("schema")
@click.argument("kind", type=click.Choice(SCHEMA_KINDS))
def schema_command(kind: str) -> None:
    """Print the JSON Schema of a record: run (gpuvet run --out), export (gpuvet export), watch
    (one line of a gpuvet watch --log file) or cluster (gpuvet cluster --out)."""
    click.echo(shipped_schema(kind), nl=False)


@cli.command()
@click.argument("symptom", required=False, metavar='["SYMPTOM"]')
@click.option("--run", "run_path", metavar="FILE", help="Answer from this run record (default: the latest stored run).")
@click.option("--db", metavar="PATH", help="The history database to take the latest run from.")
@click.option("--json", "as_json", is_flag=True, help="Print the symptoms, or the diagnosis, as JSON.")
def doctor(symptom: str | None, run_path: str | None, db: str | None, as_json: bool) -> None:
    """From a symptom ("slower and slower", "no kernel image") to its likely causes and the checks that tell them apart."""
    console = terminal.stdout_console()
    if not symptom:
        _doctor_out(console, None, as_json)
        return
    found = doctor_module.find_symptom(symptom)
    if found is None:
        if not as_json:
            doctor_module.render_doctor(console)
        raise UsageProblem(f"unknown symptom {symptom!r}; doctor knows: {doctor_module.known_symptoms()}")
    record, source, note = _record_for_doctor(run_path, db)
    _doctor_out(console, doctor_module.diagnose(found, record, source, note), as_json)


def _doctor_out(console, diagnosis, as_json: bool) -> None:
    if not as_json:
        doctor_module.render_doctor(console, diagnosis)
        return
    import json

    if diagnosis is None:
        data: object = [{"name": s.name, "description": s.description} for s in doctor_module.SYMPTOMS]
    else:
        record = diagnosis.record
        data = {"symptom": diagnosis.symptom.name, "description": diagnosis.symptom.description,
                "advice": diagnosis.symptom.advice or None,
                "run": None if record is None else {"source": diagnosis.source, "started_at": record.started_at,
                                                    "verdict": record.verdict, "note": diagnosis.source_note},
                "causes": [{"cause": r.cause.name, "state": r.state, "figures": r.figures, "next_step": r.next_step or None,
                            "measure": r.cause.measure, "commands": list(r.cause.commands)} for r in diagnosis.results]}
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


FULL_PROFILES = ("default", "soak")  # a plain `gpuvet run` (or --soak): facts and every benchmark


def _record_for_doctor(run_path: str | None, db: str | None):
    """The record to answer from, and which run it is. A file is taken as given (a run record or
    an export, as `report` takes them). From the history: the latest full `gpuvet run` of the
    machine the latest run was on, since a later `gpuvet workload` or `bench` measured only part of
    what doctor asks about; without a full run, the latest run, said to be partial."""
    if run_path:
        try:
            return runner.rejudge(load_run_file(run_path)), run_path, None
        except CaptureError as err:
            raise UsageProblem(str(err)) from None
    try:
        from ..store import Store

        with Store(db, create=False, read_only=True) as store:
            return _latest_full_run(store)
    except StoreError:
        return None, None, None  # no history yet: answer with the checks to run


def _latest_full_run(store):
    latest = store.runs(limit=1)
    if not latest:
        return None, None, None
    newest = latest[0]
    for summary in store.runs(machine_key=newest.machine_key):
        record = store.get(summary.id)
        if record.options.get("profile") in FULL_PROFILES:
            later = "" if summary.id == newest.id else f"; the later run #{newest.id} was partial ({_what_ran(store.get(newest.id))})"
            return runner.rejudge(record), f"run #{summary.id}", f"this machine's latest full `gpuvet run`{later}"
    record = store.get(newest.id)
    return runner.rejudge(record), f"run #{newest.id}", (f"a partial run ({_what_ran(record)}); no full `gpuvet run` of "
                                                         f"this machine is stored, which would measure more of the causes")


def _what_ran(record) -> str:
    profile = record.options.get("profile")
    benchmarks = record.options.get("benchmarks") or []
    if benchmarks and profile == "bench":
        return "only " + ", ".join(benchmarks)
    return {"quick": "facts only: gpuvet run --quick", "watch": "a watch log"}.get(profile, "facts only: a capture or import")


def _cluster_report(record: dict, fmt: str, out: str | None, verbose: bool, redact: bool) -> None:
    """A cluster record (gpuvet cluster --out), its types checked by the loader: one line per
    node, stragglers, cross-node verdict."""
    from ..cluster import rejudge_cluster
    from ..untrusted_text import clean_strings
    from ..report import cluster_view

    data = rejudge_cluster(clean_strings(record))
    if redact:
        data = cluster_view.redact_cluster(data)
    if fmt == "terminal":
        if out:
            raise UsageProblem("--out needs --format md, html or json")
        cluster_view.render(data, terminal.stdout_console(), verbose)
        return
    render = {"json": cluster_view.to_json, "md": lambda d: cluster_view.render_markdown(d, verbose=True),
              "html": lambda d: cluster_view.render_html(d, verbose=True)}[fmt]
    text = render(data)
    if out:
        write_atomically(out, text, redacted=redact)
    else:
        click.echo(text)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON (checks and benchmarks).")
def checks(as_json: bool) -> None:
    """Every check id gpuvet can emit and every benchmark it runs (like `dcgmi diag` lists its tests)."""
    from .. import catalog
    from ..report.catalog_view import catalog_lines

    if as_json:
        click.echo(json.dumps(catalog.as_json(), indent=2))
        return
    terminal.print_columns(terminal.stdout_console(), list(catalog_lines(catalog.CHECKS, catalog.BENCHMARKS)))
