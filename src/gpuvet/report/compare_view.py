"""Comparisons and history for people: a rich terminal table, Markdown, and a JSON-ready dict.

Everything shown is computed in `gpuvet.compare`; this module only lays it out. Columns are runs,
rows are quantities; each value carries its difference to the best run, which is marked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..console import HAVE_RICH, Console, escape
from ..compare.money import SYMBOLS, currency
from ..compare import KEY_FIGURES, Comparison, FindingRow, Row, Trend
from .markdown import cell as markdown_cell
from .numbers import number
from ..record import FAIL, MEASURED, PASS, SKIP, WARN
from ..store import RunSummary

if HAVE_RICH:  # the tables need it; without it the CLI offers --json and Markdown instead
    from rich.table import Table

SCHEMA = "gpuvet.compare/1"
STATUS_STYLE = {FAIL: "bold red", WARN: "bold yellow", PASS: "green", SKIP: "dim", MEASURED: "cyan"}


# -- formatting shared by the terminal and Markdown ------------------------------------------

def _number(value: float | None, unit: str) -> str:
    """A cell: money in its currency (a cost row's unit is the prices' ISO code: "¥13.79", "$2.50"),
    a yes/no figure as yes/no, else the number."""
    if value is None:
        return "—"
    if _is_money(unit):
        return currency(unit).amount(value)
    if unit == "bool":  # a yes/no figure (workload.resume_ok), not "1"
        return "yes" if value else "no"
    return number(value)


def _is_money(unit: str) -> bool:
    return unit in SYMBOLS


def _unit_words(row: Row) -> str:
    """The unit after a row's label: none for money (its cells carry the currency) and yes/no figures."""
    return "" if _is_money(row.unit) or row.unit == "bool" else f" {row.unit}"


def _within_spread(row: Row, i: int) -> bool:
    return bool(row.within_spread) and row.within_spread[i]


SPREAD_WORDS = "within run-to-run spread"


def _relative(pct: float | None) -> str:
    if pct is None or abs(pct) < 0.05:
        return ""
    if pct >= 900:  # "+118563%" reads worse than "1187x"
        return f"{1 + pct / 100:,.0f}x"
    return f"{pct:+.0f}%" if abs(pct) >= 1 else f"{pct:+.1f}%"


def _hours(hours: float | None) -> str:
    if hours is None:
        return "—"
    if hours >= 1:
        return f"{hours:,.1f} h"
    if hours * 60 >= 1:
        return f"{hours * 60:.0f} min"
    return f"{hours * 3600:.0f} s" if hours * 3600 >= 1 else "< 1 s"


def _price(price: float | None, code: str = "USD") -> str:
    return currency(code).per_hour(price) if price is not None else "—"


def _shown_findings(comparison: Comparison, verbose: bool) -> tuple[list[FindingRow], int]:
    """The checks any run failed or warned on, or whose status differs between runs (all with
    `verbose`), and how many others there are (passed or skipped everywhere)."""
    shown = [r for r in comparison.findings if r.shown]
    return (comparison.findings if verbose else shown), len(comparison.findings) - len(shown)


def _status_text(status: str | None) -> str:
    """A run's status for a check; a skip or a missing check is said plainly: it was not checked
    there, which is neither a pass nor a disagreement."""
    if status is None:
        return "not checked"
    if status == MEASURED:
        return "measured, not judged"
    return "not checked (skip)" if status == SKIP else status.upper()


def _problems(comparison: Comparison) -> list[str]:
    """One line per failure or warning of a run: the check, where, and what it found."""
    lines = []
    for row in comparison.findings:
        for run, status, subject, summary in zip(comparison.runs, row.statuses, row.subjects or [None] * len(row.statuses),
                                                 row.summaries):
            if status in (FAIL, WARN):
                where = f"{subject}: " if subject else ""
                lines.append(f"{status.upper()} {row.check} on {run.name}: {where}{summary or ''}".rstrip(": "))
    return lines


def _others_line(same: int) -> str:
    return f"{same} other check{'s' if same != 1 else ''} passed or were skipped on every run"


def _row_note(row: Row) -> str:
    if row.not_comparable:
        return f"({row.not_comparable})"
    if row.closer_to_zero:
        return "(closer to 0 is better)"
    return "(lower is better)" if row.lower_is_better and not _is_money(row.unit) else ""


# -- terminal ---------------------------------------------------------------------------------

def render(comparison: Comparison, console: Console, verbose: bool = False) -> None:
    """The comparison as one table (runs as columns), then the ranking and its one sentence."""
    table = Table(show_header=True, header_style="bold", show_lines=False, pad_edge=False)
    table.add_column("")
    for run in comparison.runs:
        table.add_column(escape(run.name), overflow="fold")
    table.add_row("GPUs", *[escape(r.gpus) for r in comparison.runs])
    table.add_row("started (UTC)", *[r.started_at.replace("T", " ")[:16] for r in comparison.runs])
    table.add_row("verdict", *[f"[{STATUS_STYLE.get(r.verdict, '')}]{r.verdict.upper()}[/]" for r in comparison.runs])
    table.add_row("price", *[_price(r.price_per_hour, comparison.currency) for r in comparison.runs])
    _section(table, "Measured (median over GPUs)", comparison.measurements)
    _section(table, "Cost per unit of work", comparison.costs)
    if comparison.job:
        job = comparison.job
        table.add_section()
        table.add_row(f"[bold]Job: {escape(job.description)}[/]", *[""] * len(comparison.runs))
        table.add_row("time", *[_hours(h) for h in job.hours])
        table.add_row("cost", *[_number(c, comparison.currency) for c in job.cost_usd])
    rows, same = _shown_findings(comparison, verbose)
    if rows:
        table.add_section()
        table.add_row("[bold]Findings: problems and differences[/]" if not verbose else "[bold]Findings[/]",
                      *[""] * len(comparison.runs))
        for row in rows:
            table.add_row(escape(row.check), *[_status_cell(s) for s in row.statuses])
    console.print(table)
    for line in _problems(comparison):
        console.print(f"  {escape(line)}")
    if same and not verbose:
        console.print(f"[dim]{_others_line(same)} (-v lists them).[/]")
    if comparison.single_run_measurements:
        console.print(f"[dim]{comparison.single_run_measurements} measurements only one run has are not compared.[/]")
    _ranking(comparison, console)
    for note in comparison.notes:
        console.print(f"[dim]· {escape(note)}[/]")


def _section(table: Table, title: str, rows: list[Row]) -> None:
    if not rows:
        return
    table.add_section()
    table.add_row(f"[bold]{title}[/]", *[""] * len(rows[0].values))
    for row in rows:
        unit = _unit_words(row)
        note = _row_note(row)
        label = escape(f"{row.label}{unit}") + (f" [dim]{escape(note)}[/]" if note else "")
        table.add_row(label, *[_cell(row, i) for i in range(len(row.values))])


def _cell(row: Row, i: int) -> str:
    text = _number(row.values[i], row.unit)
    if row.values[i] is None:
        return f"[dim]{text}[/]"
    if _is_best(row, i):
        return f"[bold green]{text}[/] [dim]best[/]"
    relative = _relative(row.relative_pct[i] if row.relative_pct else None)
    if relative and _within_spread(row, i):
        relative += f", {SPREAD_WORDS}"
    return f"{text} [dim]{relative}[/]" if relative else text


def _is_best(row: Row, i: int) -> bool:
    """Marked best: the best value, every run that ties on it, and only when there is a choice."""
    return i in row.best_runs and sum(v is not None for v in row.values) > 1


def _status_cell(status: str | None) -> str:
    if status in (None, SKIP):
        return f"[dim]{_status_text(status)}[/]"
    return f"[{STATUS_STYLE.get(status, '')}]{_status_text(status)}[/]"


def _ranking(comparison: Comparison, console: Console) -> None:
    if comparison.ranking:
        console.print(f"\n[bold]Ranked by {escape(comparison.rank_unit or '')}[/] (cheapest result first)")
        for n, entry in enumerate(comparison.ranking, 1):
            console.print(f"  {n}. {escape(entry.name):<24} {_number(entry.cost, comparison.currency):>12}   at {_price(entry.price_per_hour, comparison.currency)}")
    for name, why in comparison.unranked.items():
        console.print(f"  [dim]{escape(name)}: not ranked ({escape(why)})[/]")
    if comparison.verdict:
        console.print(f"\n{escape(comparison.verdict)}")


# -- Markdown ---------------------------------------------------------------------------------

def to_markdown(comparison: Comparison, verbose: bool = False) -> str:
    names = [r.name for r in comparison.runs]
    lines = ["| | " + " | ".join(_md(n) for n in names) + " |", "|---|" + "---|" * len(names)]
    lines.append("| GPUs | " + " | ".join(_md(r.gpus) for r in comparison.runs) + " |")
    lines.append("| started (UTC) | " + " | ".join(r.started_at.replace("T", " ")[:16] for r in comparison.runs) + " |")
    lines.append("| verdict | " + " | ".join(r.verdict.upper() for r in comparison.runs) + " |")
    lines.append("| price | " + " | ".join(_price(r.price_per_hour, comparison.currency) for r in comparison.runs) + " |")
    for title, rows in (("Measured (median over GPUs)", comparison.measurements), ("Cost per unit of work", comparison.costs)):
        if rows:
            lines.append(f"| **{title}** |" + " |" * len(names))
            lines += [_md_row(row) for row in rows]
    if comparison.job:
        job = comparison.job
        lines.append(f"| **Job: {_md(job.description)}** |" + " |" * len(names))
        lines.append("| time | " + " | ".join(_hours(h) for h in job.hours) + " |")
        lines.append("| cost | " + " | ".join(_number(c, comparison.currency) for c in job.cost_usd) + " |")
    finding_rows, same = _shown_findings(comparison, verbose)
    if finding_rows:
        lines.append(f"| **{'Findings' if verbose else 'Findings: problems and differences'}** |" + " |" * len(names))
        lines += ["| " + _md(r.check) + " | " + " | ".join(_status_text(s) for s in r.statuses) + " |" for r in finding_rows]
    out = ["\n".join(lines)]
    problems = _problems(comparison)
    if problems:
        out.append("\n".join(f"- {_md(line)}" for line in problems))
    if same and not verbose:
        out.append(f"{_others_line(same)}.")
    if comparison.ranking:
        ranked = [f"{n}. {_md(e.name)}: {_number(e.cost, comparison.currency)} at {_price(e.price_per_hour, comparison.currency)}"
                  for n, e in enumerate(comparison.ranking, 1)]
        out.append(f"**Ranked by {_md(comparison.rank_unit or '')}** (cheapest result first)\n\n" + "\n".join(ranked))
    if comparison.unranked:
        out.append("\n".join(f"- {_md(name)}: not ranked ({_md(why)})" for name, why in comparison.unranked.items()))
    if comparison.verdict:
        out.append(_md(comparison.verdict))
    if comparison.notes:
        out.append("\n".join(f"- {_md(note)}" for note in comparison.notes))
    return "\n\n".join(out) + "\n"


def _md_row(row: Row) -> str:
    cells = []
    for i, value in enumerate(row.values):
        text = _number(value, row.unit)
        if value is not None and _is_best(row, i):
            text = f"**{text}** (best)"
        elif value is not None:
            relative = _relative(row.relative_pct[i] if row.relative_pct else None)
            if relative and _within_spread(row, i):
                relative += f", {SPREAD_WORDS}"
            text = f"{text} ({relative})" if relative else text
        cells.append(text)
    unit = _unit_words(row)
    note = _row_note(row)
    return f"| {_md(row.label + unit + (' ' + note if note else ''))} | " + " | ".join(cells) + " |"


def _md(text: str) -> str:
    """A run's name, a label, a GPU name (anyone's words) in a table cell or a line: escaped as
    the run report escapes them, so no `<script>`, image or `javascript:` link is rendered."""
    return markdown_cell(text)


# -- JSON -------------------------------------------------------------------------------------

def to_dict(comparison: Comparison) -> dict[str, Any]:
    """The comparison as plain data (json.dumps-able), with its own schema name."""
    data = {"schema": SCHEMA, **dataclasses.asdict(comparison)}
    for row, shown in zip(data["findings"], comparison.findings):
        row["shown"] = shown.shown  # what the terminal and Markdown list without -v
    return data


# -- history ----------------------------------------------------------------------------------

def render_history(summaries: list[RunSummary], console: Console) -> None:
    """`gpuvet history`: one line per run, newest first, with its key figures."""
    if not summaries:
        console.print("No runs stored yet (`gpuvet run` saves every run).")
        return
    present = [(name, label, unit) for name, label, unit in KEY_FIGURES if any(name in s.figures for s in summaries)]
    table = Table(show_header=True, header_style="bold", pad_edge=False)
    for column in ("id", "started (UTC)", "kind", "label", "GPUs", "verdict", "price", "machine"):
        table.add_column(column, overflow="fold")
    for _, label, unit in present:
        table.add_column(f"{label} {unit}", justify="right")
    said = any(s.summary for s in summaries)  # health runs: what the node's check said, run by run
    if said:
        table.add_column("health", overflow="fold")
    for s in summaries:
        health = [escape((s.summary or "").removeprefix("gpuvet: "))] if said else []
        table.add_row(str(s.id), s.started_at.replace("T", " ")[:16], s.kind, escape(s.label or ""), escape(s.gpus),
                      f"[{STATUS_STYLE.get(s.verdict, '')}]{s.verdict.upper()}[/]", _price(s.price_per_hour),
                      s.machine_key, *[_number(s.figures.get(name), unit) for name, _, unit in present], *health)
    console.print(table)


def render_machines(machines: list[tuple[str, str, int]], console: Console) -> None:
    """`gpuvet history --machine` without a key: the machines the store knows."""
    if not machines:
        console.print("No runs stored yet (`gpuvet run` saves every run).")
        return
    table = Table(show_header=True, header_style="bold", pad_edge=False)
    for column in ("machine", "runs", "what"):
        table.add_column(column, overflow="fold")
    for key, description, count in machines:
        table.add_row(key, str(count), escape(description))
    console.print(table)


SPARKS = "▁▂▃▄▅▆▇█"
SERIES_SHOWN = 12  # values listed per figure; a longer series shows its latest ones


def sparkline(values: list[float]) -> str:
    """One block per value, its height in the range of the series (flat: all the same height)."""
    low, high = min(values), max(values)
    if high - low <= 1e-12 * max(abs(high), 1.0):
        return SPARKS[3] * len(values)
    return "".join(SPARKS[round((v - low) / (high - low) * (len(SPARKS) - 1))] for v in values)


def series_text(values: list[float], unit: str) -> str:
    """The series in run order, oldest first: "▁▅█ 560, 690, 700" (the latest SERIES_SHOWN)."""
    shown = values[-SERIES_SHOWN:]
    earlier = f"… +{len(values) - len(shown)} earlier, " if len(values) > len(shown) else ""
    return f"{sparkline(shown)} {earlier}{', '.join(_number(v, unit) for v in shown)}"


def render_trend(trend: Trend, console: Console) -> None:
    """How one machine's figures moved: every value in run order, change, and day vs night."""
    if not trend.figures:
        console.print(f"{trend.runs} runs of this machine, none with benchmark figures to follow.")
        return
    first, last = (trend.first_at or "")[:16].replace("T", " "), (trend.last_at or "")[:16].replace("T", " ")
    console.print(f"[bold]{trend.runs} runs[/] from {first} to {last} UTC")
    table = Table(show_header=True, header_style="bold", pad_edge=False)
    for column in ("figure", "runs", "values, oldest first", "change", "day", "night"):
        table.add_column(column, justify="right" if column in ("runs", "change", "day", "night") else "left")
    for f in trend.figures:
        table.add_row(f"{f.label} {f.unit}", str(len(f.points)), series_text([v for _, v in f.points], f.unit),
                      _relative(f.change_pct) or "—", _number(f.day_median, f.unit), _number(f.night_median, f.unit))
    console.print(table)
    for f in trend.figures:
        console.print(f"  {escape(f.sentence)}")
    console.print(f"[dim]{escape(trend.clock)}[/]")


def trend_to_dict(trend: Trend) -> dict[str, Any]:
    return {"schema": "gpuvet.trend/1", **dataclasses.asdict(trend)}


def summaries_to_dicts(summaries: list[RunSummary]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(s) for s in summaries]
