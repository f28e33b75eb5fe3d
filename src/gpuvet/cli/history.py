"""The commands over stored runs: history, show, export, import, compare."""

from __future__ import annotations

import json

import click
from rich.console import Console

from .. import runner
from ..compare import compare as compare_runs
from ..compare import entry, history_trend
from ..probe.errors import CaptureError
from ..report import compare_view
from ..store import StoreError
from .base import UsageProblem, cli, emit, open_store

_db = click.option("--db", metavar="PATH", help="The history database (default: $GPUVET_DB or ~/.local/share/gpuvet).")


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


@cli.command()
@click.option("--machine", "machine", is_flag=False, flag_value="", default=None, metavar="[KEY]",
              help="Group runs by machine (GPU UUIDs); with a KEY, that machine's runs and how its figures moved.")
@click.option("--limit", type=click.IntRange(min=1), help="Show at most this many runs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_db
def history(machine: str | None, limit: int | None, as_json: bool, db: str | None) -> None:
    """List stored runs: date, label, GPUs, verdict, key figures."""
    try:
        store = open_store(db)
    except UsageProblem:
        click.echo("no runs yet (gpuvet run stores every run)")
        return
    with store:
        try:
            if machine == "":
                machines = store.machines()
                if as_json:
                    click.echo(json.dumps([{"machine": k, "description": d, "runs": n} for k, d, n in machines], indent=2))
                else:
                    compare_view.render_machines(machines, _console())
                return
            summaries = store.runs(machine_key=machine or None, limit=limit)
            if as_json:
                click.echo(json.dumps(compare_view.summaries_to_dicts(summaries), indent=2))
                return
            compare_view.render_history(summaries, _console())
            if machine:
                compare_view.render_trend(history_trend(store.records(machine)), _console())
        except StoreError as err:
            raise UsageProblem(str(err)) from None


@cli.command()
@click.argument("run_id", type=int)
@click.option("--format", "fmt", type=click.Choice(["terminal", "json"]), default="terminal", show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="List every finding, passes included.")
@_db
def show(run_id: int, fmt: str, verbose: bool, db: str | None) -> None:
    """Print one stored run, judged again with this version's rules."""
    with open_store(db) as store:
        try:
            record = store.get(run_id)
        except StoreError as err:
            raise UsageProblem(str(err)) from None
    emit(runner.rejudge(record), fmt == "json", None, verbose)


@cli.command("export")
@click.argument("run_ids", nargs=-1, required=True, type=int, metavar="ID...")
@_db
def export_runs(run_ids: tuple[int, ...], db: str | None) -> None:
    """Write stored runs as JSON to stdout (gpuvet export 3 4 > runs.json)."""
    with open_store(db) as store:
        try:
            click.echo(json.dumps(store.export(list(run_ids)), indent=2))
        except StoreError as err:
            raise UsageProblem(str(err)) from None


@cli.command("import")
@click.argument("path", metavar="FILE")
@_db
def import_runs(path: str, db: str | None) -> None:
    """Add runs exported elsewhere (or a run record) to this machine's history."""
    try:
        with open(path, encoding="utf-8") as f:
            items = json.load(f)
    except OSError as err:
        raise UsageProblem(f"{path}: cannot read it ({err.strerror or err})") from None
    except ValueError as err:
        raise UsageProblem(f"{path}: not JSON ({err})") from None
    items = items if isinstance(items, list) else [items]
    with open_store(db, create=True) as store:
        try:
            ids = store.import_records(items)
        except (StoreError, ValueError) as err:
            raise UsageProblem(f"{path}: {err}") from None
    click.echo(f"imported {len(items)} run(s) as {', '.join(str(i) for i in ids)}")


@cli.command("compare")
@click.argument("refs", nargs=-1, required=True, metavar="ID|FILE...")
@click.option("--job", metavar='"8 h on REF"', help="A job you know the length of on one run; its time and cost on every run.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--md", "as_md", is_flag=True, help="Print Markdown.")
@click.option("-v", "--verbose", is_flag=True, help="Every shared measurement and finding.")
@_db
def compare(refs: tuple[str, ...], job: str | None, as_json: bool, as_md: bool, verbose: bool, db: str | None) -> None:
    """Put runs side by side, with the cost per unit of work where prices are known."""
    entries = []
    store = None
    try:
        for ref in refs:
            if ref.isdigit():
                store = store or open_store(db)
                entries.append(entry(store.get(int(ref)), f"#{ref}"))
            else:
                entries += _file_entries(ref)
        comparison = compare_runs(entries, job)
    except (StoreError, ValueError, CaptureError) as err:
        raise UsageProblem(str(err)) from None
    finally:
        if store is not None:
            store.close()
    if as_json:
        click.echo(json.dumps(compare_view.to_dict(comparison), indent=2))
    elif as_md:
        click.echo(compare_view.to_markdown(comparison, verbose=verbose))
    else:
        compare_view.render(comparison, _console(), verbose=verbose)


def _file_entries(path: str) -> list:
    """A run record file, or an export (a list of records)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as err:
        raise CaptureError(f"{path}: cannot read it ({err.strerror or err})") from None
    except ValueError:
        raise CaptureError(f"{path}: not a gpuvet run record or export (not JSON)") from None
    items = data if isinstance(data, list) else [data]
    from ..record import RunRecord

    try:
        records = [RunRecord.from_dict(item) for item in items]
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise CaptureError(f"{path}: not a gpuvet run record ({err})") from None
    return [entry(record, path if len(records) == 1 else f"{path}[{i}]") for i, record in enumerate(records)]
