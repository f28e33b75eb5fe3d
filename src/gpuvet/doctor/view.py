"""doctor on the terminal: the symptom list, or one symptom's causes with what the run said."""

from __future__ import annotations


from ..console import Console, escape
from .shapes import CONFIRMED, RULED_OUT, UNKNOWN, Diagnosis
from .symptoms import SYMPTOMS

# -- terminal --------------------------------------------------------------------------------------

_STATE_STYLE = {CONFIRMED: ("FOUND", "bold red"), RULED_OUT: ("ruled out", "green"), UNKNOWN: ("?", "dim")}


def render_doctor(console: Console, diagnosis: Diagnosis | None = None) -> None:
    """The symptoms gpuvet knows (no diagnosis), or one diagnosis."""
    if diagnosis is None:
        _symptom_list(console)
    else:
        _diagnosis(console, diagnosis)


def _symptom_list(console: Console) -> None:
    console.print("[bold]Symptoms gpuvet doctor knows[/]  [dim](gpuvet doctor NAME, or describe it in your words)[/]")
    for s in SYMPTOMS:
        console.print(f"  [cyan]{s.name:<24}[/] {escape(s.description)}")  # the original words stay searchable


def _diagnosis(console: Console, d: Diagnosis) -> None:
    s = d.symptom
    console.print(f"[bold]{escape(s.description)}[/]  [dim]({s.name})[/]")
    if d.record is None:
        console.print("[dim]No run record: the likely causes and how to tell them apart.[/]")
    else:
        r = d.record
        source = f"{d.source} (started {r.started_at}" if d.source else f"the run of {r.started_at} ("
        console.print(f"[dim]Answered from {escape(source)}, {r.machine.source}, verdict {r.verdict})"
                      f"{': ' + escape(d.source_note) if d.source_note else ''}.[/]")
    for result in d.results:
        word, style = _STATE_STYLE[result.state]
        console.print(f"\n  [{style}]{word:<9}[/]  {escape(result.cause.name)}")
        for figure in result.figures:
            console.print(f"             [dim]{escape(figure)}[/]")
        if result.next_step:
            label = "fix/confirm:" if result.state == CONFIRMED else "check:"
            console.print(f"             [cyan]{label}[/] {escape(result.next_step)}")
    if s.advice:
        console.print(f"\n[bold]Whatever the cause:[/] {escape(s.advice)}")
