"""The commands over stored runs: history, show, label, export, import, compare."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from datetime import datetime

import click

from ..console import HAVE_RICH, RICH_MISSING, Console
from ..compare import compare as compare_runs
from ..compare import entry, history_trend, with_prices
from ..compare.money import USD, Currency, currency, split_price
from ..compare.platforms import merge_machines, platform_of, platform_sentences
from ..probe.errors import CaptureError
from ..record import RunRecord, exit_code
from ..record.load import EXPORT, RUN, load, load_runs
from ..report import compare_view, terminal
from ..report.redact import Redactor
from ..store import NoStoreYet, Store, StoreError, check_price, machine_identity
from .base import PRICE, UsageProblem, check_out_path, cli, open_store, show_record
from .stored import stored_run

_db = click.option("--db", metavar="PATH", help="The history database (default: $GPUVET_DB or ~/.local/share/gpuvet).")
_json = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
_redact = click.option("--redact", is_flag=True, help="Remove hostnames, serials, UUIDs and IP/MAC addresses (to share publicly).")


def _console() -> Console:
    """The console the history and compare tables are drawn on (by rich)."""
    if not HAVE_RICH:
        raise UsageProblem(f"this table is drawn by {RICH_MISSING}; --json works without it")
    return terminal.stdout_console()


def local_clock() -> tuple[float, str]:
    """This machine's offset from UTC now, in hours, and its time zone's name."""
    now = datetime.now().astimezone()
    offset = now.utcoffset()
    return (offset.total_seconds() / 3600 if offset else 0.0), (now.tzname() or "local time")


@cli.command()
@click.option("--machine", "machine", is_flag=False, flag_value="", default=None, metavar="[KEY]",
              help="Group runs by machine (GPU UUIDs); with a KEY (or its start), that machine's runs and how its figures moved.")
@click.option("--limit", type=click.IntRange(min=1), help="Show at most this many runs.")
@click.option("--kind", metavar="KIND", help='Only runs of this kind: health (the fleet checks), quick, default, soak, bench.')
@click.option("--utc-offset", type=click.FloatRange(min=-14, max=14), metavar="HOURS",
              help="Day vs night on this clock (default: this machine's time zone), e.g. 8 for UTC+8.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_redact
@_db
def history(machine: str | None, limit: int | None, kind: str | None, utc_offset: float | None, as_json: bool,
            redact: bool, db: str | None) -> None:
    """List stored runs: date, label, GPUs, verdict, key figures."""
    try:
        store = Store(db, create=False, read_only=True)
    except NoStoreYet:
        click.echo("[]" if as_json else "no runs yet (gpuvet run stores every run)")
        return
    except StoreError as err:
        raise UsageProblem(str(err)) from None
    with store:
        try:
            redactor = _redactor_for(store.runs()) if redact else None
            if machine == "":
                machines = store.machines()
                if redactor:
                    machines = [(redactor.token(MACHINE, k), redactor.text(d), n) for k, d, n in machines]
                if as_json:
                    click.echo(json.dumps([{"machine": k, "description": d, "runs": n} for k, d, n in machines], indent=2))
                else:
                    compare_view.render_machines(machines, _console())
                return
            key = _machine_key(store, machine, redactor) if machine else None
            summaries = store.runs(machine_key=key, limit=limit, kind=kind)
            if redactor:
                summaries = [_redacted_summary(s, redactor) for s in summaries]
            if key is None:
                if as_json:
                    click.echo(json.dumps(compare_view.summaries_to_dicts(summaries), indent=2))
                else:
                    compare_view.render_history(summaries, _console())
                return
            if utc_offset is None:
                offset, local_zone = local_clock()
                zone = None if (offset, local_zone) in ((0.0, "UTC"), (0.0, "GMT")) else f"local time {local_zone}"
            else:
                offset, zone = utc_offset, None
            trend = history_trend(store.records(key), utc_offset_hours=offset, zone=zone)
        except StoreError as err:
            raise UsageProblem(str(err)) from None
        finally:
            _say_damaged(store)
    if as_json:
        click.echo(json.dumps({"machine": redactor.token(MACHINE, key) if redactor else key, "runs": compare_view.summaries_to_dicts(summaries),
                               "trend": compare_view.trend_to_dict(trend)}, indent=2))
        return
    compare_view.render_history(summaries, _console())
    compare_view.render_trend(trend, _console())
    if utc_offset is None and trend.figures:
        click.echo("(day and night on this machine's time zone; --utc-offset HOURS for another)")


def _say_damaged(store: Store) -> None:
    """One line per stored run that could not be read: the listing shows the rest without it."""
    for run_id, why in sorted(store.damaged.items()):
        click.echo(f"gpuvet: warning: run {run_id} in {store.path} is damaged and left out ({why}); "
                   "the other runs are shown", err=True)


def _redactor_for(summaries: list) -> Redactor:
    """A redactor that knows every stored hostname, so the machine descriptions lose them too."""
    redactor = Redactor()
    redactor.learn([{"hostname": s.hostname} for s in summaries if s.hostname])
    return redactor


MACHINE = "MACHINE"  # the redaction category of machine keys


def _redacted_summary(summary, redactor: Redactor):
    return dataclasses.replace(
        summary, hostname=redactor.token("HOST", summary.hostname) if summary.hostname else None,
        machine_key=redactor.token(MACHINE, summary.machine_key),  # the key links runs to one machine
        machine_basis=redactor.text(summary.machine_basis), label=redactor.text(summary.label) if summary.label else None)


def _machine_key(store: Store, given: str, redactor: Redactor | None = None) -> str:
    """The one machine key that is `given` or starts with it (as git resolves a short hash)."""
    machines = store.machines()
    if redactor:
        machines = [(k, redactor.text(d), n) for k, d, n in machines]
    exact = [m for m in machines if m[0] == given]
    found = exact or [m for m in machines if m[0].startswith(given.strip())]
    if len(found) == 1:
        return found[0][0]
    candidates = found or machines
    listed = ", ".join(f"{k} ({d.split(' · key from')[0]})" for k, d, _ in candidates[:10]) or "none yet"
    listed += f", and {len(candidates) - 10} more (gpuvet history --machine)" if len(candidates) > 10 else ""
    if found:
        raise UsageProblem(f"--machine {given}: starts {len(found)} machine keys, give more of it: {listed}")
    raise UsageProblem(f"--machine {given}: no such machine in this store; known: {listed}")


@cli.command()
@click.argument("run_id", type=int)
@click.option("--format", "fmt", type=click.Choice(["terminal", "md", "html", "json"]), default="terminal", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the run record as JSON (the same as --format json).")
@click.option("--out", metavar="FILE", help="Write the report to FILE instead of printing it.")
@click.option("--redact", is_flag=True, help="Remove hostnames, serials, UUIDs and IP/MAC addresses (to share publicly).")
@click.option("-v", "--verbose", is_flag=True, help="List every finding, passes included.")
@_db
def show(run_id: int, fmt: str, as_json: bool, out: str | None, redact: bool, verbose: bool, db: str | None) -> None:
    """Print one stored run, judged again with this version's rules (any report format)."""
    check_out_path(out)
    record = stored_run(db, run_id)
    show_record(record, "json" if as_json else fmt, out, redact, verbose)
    sys.exit(exit_code(record.findings))


@cli.command("label")
@click.argument("run_id", type=int)
@click.option("--label", metavar="TEXT", help='Where the run was taken, e.g. "provider A, region x" ("" removes it).')
@click.option("--price", type=PRICE, metavar="USD_PER_HOUR", help="What the machine cost per hour.")
@_json
@_db
def label_run(run_id: int, label: str | None, price: float | None, as_json: bool, db: str | None) -> None:
    """Give a stored run a label and/or a price afterwards (compare uses them)."""
    if label is None and price is None:
        raise UsageProblem("label: give --label TEXT and/or --price USD_PER_HOUR")
    with open_store(db) as store:
        try:
            options = store.set_label(run_id, label=label, price_per_hour=price)
        except StoreError as err:
            raise UsageProblem(str(err)) from None
    if as_json:
        click.echo(json.dumps({"id": run_id, "label": options.get("label") or None, "price": options.get("price")}))
        return
    shown_label = repr(options["label"]) if options.get("label") else "none"
    shown_price = f"${options['price']:.2f}/h" if options.get("price") is not None else "none"
    click.echo(f"run {run_id}: label {shown_label} · price {shown_price}")


@cli.command("export")
@click.argument("run_ids", nargs=-1, required=True, type=int, metavar="ID...")
@_redact
@_db
def export_runs(run_ids: tuple[int, ...], redact: bool, db: str | None) -> None:
    """Write stored runs as JSON to stdout (gpuvet export 3 4 > runs.json)."""
    with open_store(db, read_only=True) as store:
        try:
            runs = store.export(list(run_ids))
        except StoreError as err:
            raise UsageProblem(str(err)) from None
        _say_damaged(store)
    if redact:
        runs = _redacted_dicts(runs)
    click.echo(json.dumps(runs, indent=2))


def _redacted_dicts(runs: list[dict]) -> list[dict]:
    """Run records redacted together: one host is the same HOST-REDACTED-n in every run."""
    redactor = Redactor()
    redactor.learn(runs)
    clean = [redactor.walk(run) for run in runs]
    for run in clean:
        run.setdefault("options", {})["redacted"] = True
    return clean


@cli.command("import")
@click.argument("path", metavar="FILE|-")
@_json
@_db
def import_runs(path: str, as_json: bool, db: str | None) -> None:
    """Add runs exported elsewhere (or a run record) to this machine's history; - reads stdin."""
    loaded = load(path, (RUN, EXPORT))  # RecordError: one line, exit 2
    name = loaded.where
    # Every run checked the way `show` will read it back, before any is stored (all or none).
    loaded.runs()
    items = loaded.data if loaded.kind == EXPORT else [loaded.data]
    with open_store(db, create=True) as store:
        try:
            outcomes = store.import_runs(items)
        except (StoreError, ValueError) as err:
            raise UsageProblem(f"{name}: {err}") from None
    new = [o.id for o in outcomes if not o.already]
    if as_json:
        click.echo(json.dumps([{"id": o.id, "imported": not o.already, "kept": list(o.kept or [])} for o in outcomes], indent=2))
        return
    if new:
        click.echo(f"imported {len(new)} run(s) as {', '.join(map(str, new))}")
    for o in outcomes:
        if o.already:
            click.echo(f"already stored as run {o.id}" + (f": {'; '.join(o.kept)}" if o.kept else ""))
            if o.kept:
                click.echo(f"  to change them: gpuvet label {o.id} --label TEXT and/or --price USD_PER_HOUR")


def _price_override(ctx, param, values: tuple[str, ...]) -> list[tuple[str, float, str | None]]:
    """--price REF=AMOUNT, repeatable: a price for this comparison only; a currency symbol or code
    written with the amount ("¥3.5", "3.5 CNY") names the comparison's currency."""
    prices = []
    for value in values:
        ref, sep, amount = value.rpartition("=")
        if not sep or not ref.strip():
            raise click.BadParameter(f"{value!r}: write it as REF=PRICE_PER_HOUR, e.g. 3=2.49 or 3=¥3.5", ctx, param)
        number, code = split_price(amount.strip())
        try:
            prices.append((ref.strip(), check_price(number), code))
        except ValueError as err:
            raise click.BadParameter(f"{value!r}: {err}", ctx, param) from None
    return prices


def _money(given: str | None, prices: list[tuple[str, float, str | None]]) -> Currency:
    """--currency, else the one the prices were written in; two currencies are refused (gpuvet
    converts nothing)."""
    written = {code for _, _, code in prices if code}
    chosen = {currency(given).code} if given else set()
    if len(written | chosen) > 1:
        raise UsageProblem(f"prices in {', '.join(sorted(written | chosen))}: give every price in one currency "
                           "(gpuvet converts nothing)")
    return currency((written | chosen).pop()) if written | chosen else USD


@cli.command("compare")
@click.argument("refs", nargs=-1, required=True, metavar="ID|LABEL|PLATFORM|FILE...")
@click.option("--job", metavar='"8 h on REF"', help="A job you know the length of on one run (its id, #id, file or label); "
                                                   "its time and cost on every run.")
@click.option("--price", "prices", multiple=True, callback=_price_override, metavar="REF=PRICE",
              help="Price per hour of one run for this comparison only (repeatable; 3=2.49, 3=¥3.5); `gpuvet label` stores one.")
@click.option("--currency", "currency_code", metavar="CODE",
              help="The currency of the prices (USD, CNY, EUR ...; default USD, or the symbol written with --price). "
                   "Nothing is converted: give every price in it.")
@click.option("--each-run", is_flag=True, help="Keep a machine's runs apart (before and after a change) instead of merging them.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--md", "as_md", is_flag=True, help="Print Markdown.")
@click.option("-v", "--verbose", is_flag=True, help="Every shared measurement and finding.")
@_redact
@_db
def compare(refs: tuple[str, ...], job: str | None, prices: list[tuple[str, float, str | None]], currency_code: str | None,
            each_run: bool, as_json: bool, as_md: bool, verbose: bool, redact: bool, db: str | None) -> None:
    """Put runs side by side (stored runs by id or label, a platform by its labels' common start
    "autodl" of "autodl/4090-A", or record files), a machine's runs merged with their spread, with
    the cost per unit of work where prices are known."""
    try:
        money = _money(currency_code, prices)
    except ValueError as err:
        raise UsageProblem(str(err)) from None
    entries: list[tuple] = []
    store = None
    try:
        for ref in refs:
            run_id = ref.lstrip("#")
            if run_id.isdigit():
                store = store or open_store(db, read_only=True)
                entries.append(entry(store.get(int(run_id)), f"#{run_id}"))
                continue
            labelled = _labelled_entries(db, ref)  # a label first: "autodl/4090-A" is no file path
            if labelled:
                entries += labelled
            elif os.path.exists(ref) or ref.endswith(".json"):
                entries += _file_entries(ref)
            else:
                raise ValueError(_no_such_label(db, ref))
        if redact:
            entries = _redacted_entries(entries)
        notes: list[str] = []
        if not each_run:
            entries, notes = merge_machines(entries, lambda record: machine_identity(record.machine).key)
        platforms = {name: p for name, record, _ in entries if (p := platform_of(record.options.get("label")))}
        comparison = compare_runs(with_prices(entries, [(ref, price) for ref, price, _ in prices]), job, money)
    except (StoreError, ValueError, CaptureError) as err:
        raise UsageProblem(str(err)) from None
    finally:
        if store is not None:
            store.close()
    comparison.platforms = platform_sentences(comparison, platforms, money)
    comparison.notes = comparison.platforms + notes + comparison.notes
    if as_json:
        click.echo(json.dumps(compare_view.to_dict(comparison), indent=2))
    elif as_md:
        click.echo(compare_view.to_markdown(comparison, verbose=verbose))
    else:
        compare_view.render(comparison, _console(), verbose=verbose)


def _labelled_entries(db: str | None, ref: str) -> list[tuple]:
    """The stored runs a label names (every run that has it), or a platform: the runs whose label
    starts with REF/ ("autodl" for "autodl/4090-A" and "autodl/h100-B"); [] when none does, or
    there is no store."""
    try:
        store = Store(db, create=False, read_only=True)
    except NoStoreYet:
        return []
    except StoreError as err:
        raise UsageProblem(str(err)) from None
    wanted = ref.strip().casefold()
    with store:
        labels = {s.id: s.label.strip().casefold() for s in store.runs() if s.label}
        same = [run_id for run_id, label in labels.items() if label == wanted]
        group = same or [run_id for run_id, label in labels.items() if label.startswith(wanted.rstrip("/") + "/")]
        return [entry(store.get(run_id), f"#{run_id}") for run_id in sorted(group)]


def _no_such_label(db: str | None, ref: str) -> str:
    try:
        with Store(db, create=False, read_only=True) as store:
            labels = list(dict.fromkeys(repr(s.label) for s in store.runs() if s.label))[:10]
    except StoreError:
        return f"{ref}: no such file, and no runs are stored yet to find it as a label"
    known = ", ".join(labels) or "no stored run has one yet"
    return f"{ref}: no such file, and no stored run has that label or platform (labels: {known}; gpuvet history lists the runs)"


def _redacted_entries(entries: list[tuple]) -> list[tuple]:
    """The records redacted together (one host is the same token in every run), and the names
    too: a file name can hold a user's home directory or a hostname."""
    redactor = Redactor()
    redactor.learn([record.to_dict() for _, record, _ in entries])
    clean = []
    for name, record, price in entries:
        data = redactor.walk(record.to_dict())
        data.setdefault("options", {})["redacted"] = True
        clean.append((redactor.text(name), RunRecord.from_dict(data), price))
    return clean


def _file_entries(path: str) -> list:
    """A run record file, or an export (a list of records)."""
    records = load_runs(path)
    return [entry(record, path if len(records) == 1 else f"{path}[{i}]") for i, record in enumerate(records)]
