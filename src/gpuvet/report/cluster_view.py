"""The cluster report (D4) for people and scripts: a terminal view and JSON.

Everything shown is in the cluster record (`gpuvet.cluster/1`, a plain dict as written to disk);
this module only lays it out, so a saved cluster record renders the same as the live one.
One line per node, worst first; then the stragglers with their figures, uniformity across nodes,
the cross-node measurements and the problems with their evidence; the verdict last.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..record import FAIL, PASS, SKIP, WARN

SCHEMA = "gpuvet.cluster/1"
BADGE_STYLE = {"MISSING": "bold red", "FAILED": "bold red", "FAIL": "bold red", "WARN": "bold yellow", "PASS": "green"}
STATUS_STYLE = {FAIL: "bold red", WARN: "bold yellow", PASS: "green", SKIP: "dim"}
PASSING_SHOWN = 20  # passing nodes listed before the rest are counted (all with verbose)
STRAGGLERS_SHOWN = 20
VERDICT_TEXT = {FAIL: "FAIL: something is wrong with this cluster", WARN: "WARN: usable, with caveats",
                PASS: "PASS: nothing wrong found"}
# Sections already show these checks in their own form; Problems lists the rest.
_SHOWN_ELSEWHERE = {"cluster.stragglers", "cluster.uniform"}


# Lists written one item per line: a node per line is easy to grep, and json's C encoder (which
# indent= turns off) writes a 1,000-node record in a second instead of ten.
_ONE_PER_LINE = ("nodes", "findings")


def to_json(record: dict[str, Any]) -> str:
    lines = []
    for key, value in record.items():
        if key in _ONE_PER_LINE and isinstance(value, list):
            text = "[\n" + ",\n".join(f"    {json.dumps(item)}" for item in value) + "\n  ]" if value else "[]"
        elif key in ("summary", "cross_node") and isinstance(value, dict):
            text = "{\n" + ",\n".join(f"    {json.dumps(k)}: {_json_list(v)}" for k, v in value.items()) + "\n  }"
        else:
            text = json.dumps(value)
        lines.append(f"  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}"


def _json_list(value: Any) -> str:
    if isinstance(value, list) and value:
        return "[\n" + ",\n".join(f"      {json.dumps(item)}" for item in value) + "\n    ]"
    return json.dumps(value)


def render(record: dict[str, Any], console: Console, verbose: bool = False) -> None:
    _header(record, console)
    _nodes(record, console, verbose)
    _stragglers(record, console, verbose)
    _uniformity(record, console, verbose)
    _cross_node(record, console)
    _problems(record, console)
    _verdict(record, console)


def _badge(text: str, style: str | None = None) -> str:
    return f"[{style or BADGE_STYLE.get(text, '')}]{text:<7}[/]"


def _header(record: dict[str, Any], console: Console) -> None:
    nodes = record.get("nodes") or []
    counts = {state: sum(n.get("status") == state for n in nodes) for state in ("ok", "failed", "missing")}
    launcher = record.get("launcher") or {}
    when = (record.get("started_at") or "").replace("T", " ")[:16]
    parts = [f"{len(nodes)} nodes", f"{counts['ok']} reported"]
    parts += [f"{counts[s]} {s}" for s in ("failed", "missing") if counts[s]]
    console.print(f"[bold]gpuvet cluster {escape(str(record.get('cluster_id') or ''))}[/] · {', '.join(parts)} · "
                  f"{escape(str(launcher.get('kind', '?')))} · {when} UTC · {float(record.get('duration_s') or 0):.1f} s")


def _nodes(record: dict[str, Any], console: Console, verbose: bool) -> None:
    rows = (record.get("summary") or {}).get("rows") or []
    console.print("\n[bold]Nodes[/] [dim](worst first)[/]")
    width = min(28, max((len(r["name"]) for r in rows), default=4))
    passing_shown = 0
    for row in rows:
        if row["badge"] == "PASS" and not verbose:
            passing_shown += 1
            if passing_shown > PASSING_SHOWN:
                continue
        rank = f"rank {row['rank']}" if row.get("rank") is not None else ""
        console.print(f"  {_badge(row['badge'])} {escape(row['name']):<{width}} {rank:<9} {escape(row.get('gpus') or ''):<28} "
                      f"{escape(row.get('headline') or '')}")
    hidden = passing_shown - PASSING_SHOWN
    if hidden > 0:
        console.print(f"  [dim]... and {hidden} more nodes PASS with nothing to report (-v lists them)[/]")


def _stragglers(record: dict[str, Any], console: Console, verbose: bool) -> None:
    summary = record.get("summary") or {}
    baselines, stragglers = summary.get("baselines") or [], summary.get("stragglers") or []
    if not baselines:
        return
    console.print("\n[bold]Stragglers[/] [dim](robust cluster baseline: median, fix_threshold; the slowest GPU sets the pace)[/]")
    for b in baselines:
        scope = "per GPU" if b["scope"] == "gpu" else f"per node ({b['scope']})"
        console.print(f"  [dim]baseline[/] {escape(b['metric']):<22} {_number(b['value'])} {escape(b['unit'])} {scope}, "
                      f"threshold {100 * b['threshold']:.0f}% [dim](from {b['kept']} of {b['total']} values)[/]")
    shown = stragglers if verbose else stragglers[:STRAGGLERS_SHOWN]
    for s in shown:
        where = f"{s['node']} {s['subject']}".strip()
        badge = _badge(s["status"].upper(), STATUS_STYLE.get(s["status"]))
        console.print(f"  {badge} {escape(where):<24} {escape(s['metric']):<22} {_number(s['value'])} {escape(s['unit'])} "
                      f"= {100 * s['share']:.0f}% of {_number(s['baseline'])}")
    if len(stragglers) > len(shown):
        console.print(f"  [dim]... and {len(stragglers) - len(shown)} more (-v lists them)[/]")
    if not stragglers:
        console.print("  [green]no straggler[/]")


def _uniformity(record: dict[str, Any], console: Console, verbose: bool) -> None:
    rows = (record.get("summary") or {}).get("uniformity") or []
    rows = [r for r in rows if r.get("value") is not None]
    if not rows:
        return
    console.print("\n[bold]Uniformity[/] [dim](across nodes)[/]")
    for r in rows:
        if not r["odd"]:
            unknown = f" [dim]({r['unknown']} did not report it)[/]" if r.get("unknown") else ""
            everywhere = f"on all {r['count']} nodes" if r["count"] > 1 else "on the one node that reported"
            console.print(f"  [bold green]✓[/]  {escape(r['field']):<14} {escape(r['value'])} {everywhere}{unknown}")
            continue
        odd = "; ".join(f"{escape(value)} on {escape(_names(nodes, verbose))}" for value, nodes in r["odd"].items())
        mark = "[bold red]✗[/]" if r["field"] in ("GPU model", "GPU count") else "[bold yellow]![/]"
        console.print(f"  {mark}  {escape(r['field']):<14} {escape(r['value'])} on {r['count']} nodes; {odd}")


def _names(nodes: list[str], verbose: bool, limit: int = 8) -> str:
    if verbose or len(nodes) <= limit:
        return ", ".join(nodes)
    return ", ".join(nodes[:limit]) + f" and {len(nodes) - limit} more"


def _cross_node(record: dict[str, Any], console: Console) -> None:
    cross = record.get("cross_node") or {}
    findings = [f for f in record.get("findings") or [] if f["check"] in ("cluster.allreduce", "cluster.ring")]
    if not findings and not cross:
        return
    console.print("\n[bold]Cross-node[/]")
    plan = cross.get("plan") or {}
    if plan.get("members"):
        console.print(f"  [dim]{len(plan['members'])} nodes x {plan.get('ranks_per_node', '?')} ranks, "
                      f"{escape(str(plan.get('backend')))} on {escape(str(plan.get('device')))}; "
                      f"{len(plan.get('rounds') or [])} shuffled ring rounds[/]")
    for f in findings:
        if f["check"] == "cluster.allreduce" or f["subject"] == "cluster":
            console.print(f"  {_badge(f['status'].upper(), STATUS_STYLE.get(f['status']))} {escape(f['summary'])}")
    busbw = next((m for m in cross.get("measurements") or [] if m["name"] == "cluster.allreduce.busbw"), None)
    for row in (busbw or {}).get("details", {}).get("sizes") or []:
        console.print(f"  [dim]  {_size(row['bytes']):>9}  {row['time_us']:>10.1f} us  algbw {row['algbw_gbps']:.3g} GB/s  "
                      f"busbw {row['busbw_gbps']:.3g} GB/s[/]")


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _problems(record: dict[str, Any], console: Console) -> None:
    found = [f for f in record.get("findings") or [] if f["status"] in (FAIL, WARN) and f["check"] not in _SHOWN_ELSEWHERE]
    found.sort(key=lambda f: f["status"] != FAIL)
    if not found:
        return
    warned = sum(f["status"] == WARN for f in found)
    console.print(f"\n[bold]Problems[/] [dim]({sum(f['status'] == FAIL for f in found)} failed, "
                  f"{warned} warning{'' if warned == 1 else 's'})[/]")
    for f in found:
        subject = "" if f["summary"].startswith(f["subject"]) else f"{escape(f['subject'])}: "
        console.print(f"  {_badge(f['status'].upper(), STATUS_STYLE.get(f['status']))} {escape(f['check']):<20} "
                      f"{subject}{escape(f['summary'])}")
        evidence = f.get("evidence") or {}
        parts = [f"{key} {evidence[key]}" for key in ("measured", "expected") if evidence.get(key)]
        if parts:
            console.print(f"          [dim]{escape(' · '.join(parts))}[/]")
        if f.get("remedy"):
            console.print(f"          [cyan]fix/confirm:[/] {escape(f['remedy'])}")


def _verdict(record: dict[str, Any], console: Console) -> None:
    verdict = record.get("verdict", PASS)
    console.print(f"\n[{STATUS_STYLE.get(verdict, '')}]{VERDICT_TEXT.get(verdict, verdict.upper())}[/]")
    if record.get("out"):
        console.print(f"[dim]cluster record: {escape(record['out'])}[/]")


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
