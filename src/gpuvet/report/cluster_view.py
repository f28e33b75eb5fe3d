"""The cluster report (D4) for people and scripts: a terminal view, Markdown, HTML and JSON, and a
redacted copy to share.

Everything shown is in the cluster record (`gpuvet.cluster/1`, a plain dict as written to disk);
this module only lays it out (`lay_out`, the same content for every rendering), so a saved cluster
record renders the same as the live one.
One line per node, worst first; then the stragglers with their figures, uniformity across nodes,
the cross-node measurements and the problems with their evidence; the verdict last.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


from ..console import Console, escape
from ..record import FAIL, PASS, SKIP, WARN
from .numbers import number
from .redact import HOST, Redactor

SCHEMA = "gpuvet.cluster/1"
BADGE_STYLE = {"MISSING": "bold red", "FAILED": "bold red", "FAIL": "bold red", "WARN": "bold yellow", "STOPPED": "yellow",
               "PASS": "green"}
STATUS_STYLE = {FAIL: "bold red", WARN: "bold yellow", PASS: "green", SKIP: "dim"}
PASSING_SHOWN = 20  # passing nodes listed before the rest are counted (all with verbose)
STRAGGLERS_SHOWN = 20
VERDICT_TEXT = {FAIL: "FAIL: something is wrong with this cluster", WARN: "WARN: usable, with caveats",
                PASS: "PASS: nothing wrong found"}
# Sections already show these checks' figures in their own form: Problems counts them and gives
# their fix like every other FAIL and WARN, without the figures again.
_FIGURES_SHOWN_ELSEWHERE = {"cluster.stragglers", "cluster.uniform"}


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
    """The terminal view."""
    layout = lay_out(record, verbose)
    console.print(f"[bold]{escape(layout.title)}[/] · {escape(layout.subtitle)}")
    console.print("\n[bold]Nodes[/] [dim](worst first)[/]")
    width = min(28, max((len(r["name"]) for r in layout.rows), default=4))
    for row in layout.rows:
        console.print(f"  {_badge(row['badge'])} {escape(row['name']):<{width}} {_rank(row):<9} {_run(row):<10} "
                      f"{escape(row.get('gpus') or ''):<28} {escape(row.get('headline') or '')}")
    if layout.hidden_passing > 0:
        console.print(f"  [dim]... and {layout.hidden_passing} more nodes PASS with nothing to report (-v lists them)[/]")
    if layout.baselines:
        console.print(f"\n[bold]Stragglers[/] [dim]({STRAGGLER_BASIS})[/]")
        for line in layout.baselines:
            console.print(f"  [dim]baseline[/] {escape(line)}")
        for status, where, metric, figure in layout.stragglers:
            console.print(f"  {_badge(status.upper(), STATUS_STYLE.get(status))} {escape(where):<24} {escape(metric):<22} "
                          f"{escape(figure)}")
        if layout.more_stragglers:
            console.print(f"  [dim]... and {layout.more_stragglers} more (-v lists them)[/]")
        if not layout.stragglers:
            console.print("  [green]no straggler[/]")
    if layout.uniformity:
        console.print("\n[bold]Uniformity[/] [dim](across nodes)[/]")
        for mark, line in layout.uniformity:
            style = {"✓": "bold green", "✗": "bold red", "!": "bold yellow"}[mark]
            console.print(f"  [{style}]{mark}[/]  {escape(line)}")
    if layout.cross:
        console.print("\n[bold]Cross-node[/]")
        for kind, status, text in layout.cross:
            if kind == "finding":
                console.print(f"  {_badge(status.upper(), STATUS_STYLE.get(status))} {escape(text)}")
            else:
                console.print(f"  [dim]{'  ' if kind == 'size' else ''}{escape(text)}[/]")
    if layout.problems:
        console.print(f"\n[bold]Problems[/] [dim]({layout.problem_counts})[/]")
        for f in layout.problems:
            console.print(f"  {_badge(f['status'].upper(), STATUS_STYLE.get(f['status']))} {escape(f['check']):<20} "
                          f"{escape(f['text'])}")
            if f["evidence"]:
                console.print(f"          [dim]{escape(f['evidence'])}[/]")
            if f["remedy"]:
                console.print(f"          [cyan]fix/confirm:[/] {escape(f['remedy'])}")
    console.print(f"\n[{STATUS_STYLE.get(layout.verdict, '')}]{escape(layout.verdict_text)}[/]")
    if layout.out:
        console.print(f"[dim]cluster record: {escape(layout.out)}[/]")


def render_markdown(record: dict[str, Any], verbose: bool = True) -> str:
    """The same content as the terminal view, as GitHub-flavoured Markdown (every node listed
    unless verbose=False)."""
    from .markdown import cell, text

    layout = lay_out(record, verbose)
    out = [f"# {text(layout.title)}", "", text(layout.subtitle), "", f"**{text(layout.verdict_text)}**", "",
           "## Nodes (worst first)", "", "| | node | rank | saved run | GPUs | what stands out |", "|---|---|---|---|---|---|"]
    out += [f"| {row['badge']} | {cell(row['name'])} | {_rank(row)} | {cell(_run(row))} | {cell(row.get('gpus') or '')} | "
            f"{cell(row.get('headline') or '')} |" for row in layout.rows]
    if layout.hidden_passing > 0:
        out += ["", f"... and {layout.hidden_passing} more nodes PASS with nothing to report."]
    if layout.baselines:
        out += ["", "## Stragglers", "", f"_{text(STRAGGLER_BASIS)}_", ""]
        out += [f"- baseline {text(line)}" for line in layout.baselines]
        out += [f"- **{status.upper()}** {text(where)}: {text(metric)} {text(figure)}"
                for status, where, metric, figure in layout.stragglers]
        if layout.more_stragglers:
            out.append(f"- ... and {layout.more_stragglers} more")
        if not layout.stragglers:
            out.append("- no straggler")
    if layout.uniformity:
        out += ["", "## Uniformity across nodes", ""] + [f"- {mark} {text(line)}" for mark, line in layout.uniformity]
    if layout.cross:
        out += ["", "## Cross-node", ""]
        for kind, status, line in layout.cross:
            out.append(f"- **{status.upper()}** {text(line)}" if kind == "finding"
                       else f"    - {text(line)}" if kind == "size" else f"- {text(line)}")
    if layout.problems:
        out += ["", f"## Problems ({layout.problem_counts})", ""]
        for f in layout.problems:
            out.append(f"- **{f['status'].upper()}** `{f['check']}` {text(f['text'])}")
            if f["evidence"]:
                out.append(f"    - {text(f['evidence'])}")
            if f["remedy"]:
                out.append(f"    - fix/confirm: {text(f['remedy'])}")
    if layout.out:
        out += ["", f"cluster record: `{layout.out}`"]
    return "\n".join(out) + "\n"


def render_html(record: dict[str, Any], verbose: bool = True) -> str:
    """The same content as the terminal view, as one self-contained HTML page (inline styles)."""
    from html import escape as e

    from .html import CSS, rich_text

    layout = lay_out(record, verbose)
    css_class = {"MISSING": "fail", "FAILED": "fail", "FAIL": "fail", "WARN": "warn", "PASS": "pass"}

    def badge(text: str) -> str:
        return f'<span class="badge {css_class.get(text.upper(), "skip")}">{e(text.upper())}</span>'

    parts = [f'<section class="verdict {e(layout.verdict)}"><h1>{e(layout.verdict_text)}</h1>'
             f'<p class="meta">{e(layout.title)} · {e(layout.subtitle)}</p></section>',
             "<h2>Nodes <small>(worst first)</small></h2>",
             "<table><tr><th></th><th>node</th><th>rank</th><th>saved run</th><th>GPUs</th><th>what stands out</th></tr>"]
    parts += [f"<tr><td>{badge(row['badge'])}</td><td>{e(row['name'])}</td><td>{e(_rank(row))}</td><td>{rich_text(_run(row))}</td>"
              f"<td>{e(row.get('gpus') or '')}</td><td>{e(row.get('headline') or '')}</td></tr>" for row in layout.rows]
    parts.append("</table>")
    if layout.hidden_passing > 0:
        parts.append(f'<p class="note">... and {layout.hidden_passing} more nodes PASS with nothing to report.</p>')
    if layout.baselines:
        parts += ["<h2>Stragglers</h2>", f'<p class="note">{e(STRAGGLER_BASIS)}</p><ul>']
        parts += [f"<li>baseline {e(line)}</li>" for line in layout.baselines]
        parts += [f"<li>{badge(status)} {e(where)}: {e(metric)} {e(figure)}</li>" for status, where, metric, figure in layout.stragglers]
        if layout.more_stragglers:
            parts.append(f"<li>... and {layout.more_stragglers} more</li>")
        if not layout.stragglers:
            parts.append("<li>no straggler</li>")
        parts.append("</ul>")
    spread = spread_plots(record)
    if spread:
        parts.append('<h2>Spread across nodes</h2><p class="note">Each dot: one GPU (or node) on that figure; solid: the '
                     "cluster baseline, dashed: where a straggler starts. Hover a dot for its node and value.</p>")
        parts += [f'<figure class="plot">{svg}</figure>' for svg in spread]
    if layout.uniformity:
        parts += ["<h2>Uniformity across nodes</h2><ul>"] + [f"<li>{e(mark)} {e(line)}</li>" for mark, line in layout.uniformity]
        parts.append("</ul>")
    if layout.cross:
        parts.append("<h2>Cross-node</h2><ul>")
        for kind, status, line in layout.cross:
            parts.append(f"<li>{badge(status)} {e(line)}</li>" if kind == "finding" else f'<li class="note">{e(line)}</li>')
        parts.append("</ul>")
    if layout.problems:
        parts.append(f"<h2>Problems <small>({e(layout.problem_counts)})</small></h2>")
        for f in layout.problems:
            parts.append(f'<div class="finding {e(f["status"])}"><h3>{badge(f["status"])} <code>{e(f["check"])}</code> '
                         f'{e(f["text"])}</h3>' + (f'<p class="meta">{e(f["evidence"])}</p>' if f["evidence"] else "")
                         + (f'<p class="remedy">fix/confirm: {rich_text(f["remedy"])}</p>' if f["remedy"] else "") + "</div>")
    if layout.out:
        parts.append(f'<p class="note">cluster record: <code>{e(layout.out)}</code></p>')
    return ("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{e(layout.title)} · {e(layout.verdict.upper())}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
            + "\n".join(parts) + f"\n<footer>{e(layout.title)} · cluster record schema {SCHEMA}</footer>\n</main>\n</body>\n</html>\n")


def spread_plots(record: dict[str, Any]) -> list[str]:
    """One dot chart per figure the cluster compared (its baselines): every node's values, in node
    order, with the baseline and the straggler threshold drawn."""
    from ..specs.cluster_metrics import METRICS
    from . import charts

    plots = []
    for n, b in enumerate((record.get("summary") or {}).get("baselines") or []):
        metric = METRICS.get(b["metric"])
        if metric is None:
            continue
        dots = [charts.Dot(node.get("name") or "?", f"{node.get('name')} {m.get('subject') or ''}".strip(), float(m["value"]))
                for node in record.get("nodes") or [] for m in (node.get("record") or {}).get("measurements") or ()
                if m.get("name") == b["metric"] and isinstance(m.get("value"), (int, float))
                and _in_scope(m.get("subject") or "", b["scope"])]
        edge = b["value"] * (1 - b["threshold"] if metric.higher_is_better else 1 + b["threshold"])
        worse = "below" if metric.higher_is_better else "above"
        limits = [charts.Limit(f"baseline {number(b['value'])} {b['unit']}", b["value"]),
                  charts.Limit(f"straggler {worse} {number(edge)} {b['unit']}", edge)]
        scope = "per GPU" if b["scope"] == "gpu" else b["scope"]
        svg = charts.dot_chart(f"spread-{n}", f"{metric.label} ({scope}) across nodes", f"{metric.label} ({b['unit']})",
                               dots, limits, unit=b["unit"])
        if svg:
            plots.append(svg)
    return plots


def _in_scope(subject: str, scope: str) -> bool:
    return bool(re.fullmatch(r"gpu\d+", subject)) if scope == "gpu" else subject == scope


def redact_cluster(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of a cluster record fit to share: node names, hosts, the master address, and in every
    node's record what report/redact.py removes from a run record (hostnames, serials, UUIDs,
    addresses, user names). One token per distinct value across the whole cluster record: a node
    is HOST-REDACTED-3 in its row, its findings and its ring pairs alike. The record passed in is
    not changed.

    Each node's record is redacted with only its own values to look for (a redactor that knew
    every node's would try them all on every string: minutes at 100 nodes)."""
    shared = Redactor()  # hands out the tokens, so that they agree across nodes
    names = _node_names(record)
    for name in names:
        shared.token(HOST, name)
    nodes = []
    for node in record.get("nodes") or []:
        entry = {k: v for k, v in node.items() if k != "record"}
        if node.get("record") is not None:
            own = [{"hostname": v} for v in (node.get("name"), node.get("host")) if isinstance(v, str) and v.strip()]
            entry["record"] = SharedTokens(shared, {"record": node["record"], "names": own}).walk(node["record"])
        nodes.append(entry)
    rest = SharedTokens(shared, {}).walk({k: v for k, v in record.items() if k not in ("nodes", "out")})
    clean = _replace_names({**rest, "nodes": nodes}, shared, names)
    clean["options"] = {**(clean.get("options") or {}), "redacted": True}
    return clean


class SharedTokens(Redactor):
    """redact.py's rules, with the tokens of one redactor shared by all."""

    def __init__(self, shared: Redactor, learn_from: Any):
        super().__init__()
        self.shared = shared
        self.learn(learn_from)

    def token(self, category: str, value: str) -> str:
        return self.shared.token(category, value)


def _replace_names(data: Any, redactor: Any, names: list[str]) -> Any:
    """Node names wherever they are left, ring pairs included ("node-1->node-2": redact.py's word
    boundary excludes "-"), replaced by their tokens in one pass."""
    if not names:
        return data
    tokens = {n: redactor.token(HOST, n) for n in names}
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))  # longest first
    pattern = re.compile(rf"(?<![\w])(?:{alternatives})(?![\w]|-\w)")

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return pattern.sub(lambda m: tokens[m.group(0)], value)
        return value

    return clean(data)


def _node_names(record: dict[str, Any]) -> list[str]:
    """Node names and hosts in rank order, then the master's address: the order of their tokens."""
    names: list[str] = []
    for n in record.get("nodes") or []:
        names += [v for v in (n.get("name"), n.get("host")) if isinstance(v, str) and v.strip() and v not in names]
    master = str((record.get("launcher") or {}).get("master") or "").rsplit(":", 1)[0]
    if master and master not in names:
        names.append(master)
    return names


# -- the layout: the same content for every rendering ------------------------------------------

STRAGGLER_BASIS = "robust cluster baseline: median, fix_threshold; the slowest GPU sets the pace"


@dataclass
class Layout:
    title: str
    subtitle: str
    rows: list[dict[str, Any]]
    hidden_passing: int
    baselines: list[str]
    stragglers: list[tuple[str, str, str, str]]  # (status, where, metric, figure)
    more_stragglers: int
    uniformity: list[tuple[str, str]]  # (mark ✓ ✗ !, line)
    cross: list[tuple[str, str, str]]  # (kind: plan/finding/size, status, text)
    problems: list[dict[str, str]]
    problem_counts: str
    verdict: str
    verdict_text: str
    out: str | None


def lay_out(record: dict[str, Any], verbose: bool = False) -> Layout:
    rows = (record.get("summary") or {}).get("rows") or []
    shown, passing = [], 0
    for row in rows:
        if row["badge"] == "PASS" and not verbose:
            passing += 1
            if passing > PASSING_SHOWN:
                continue
        shown.append(row)
    baselines, stragglers, more = _straggler_lines(record, verbose)
    problems = _problem_items(record)
    warned = sum(f["status"] == WARN for f in problems)
    verdict = record.get("verdict", PASS)
    title, subtitle = _header_text(record)
    return Layout(title, subtitle, shown, passing - PASSING_SHOWN, baselines, stragglers, more,
                  _uniformity_lines(record, verbose), _cross_lines(record), problems,
                  f"{sum(f['status'] == FAIL for f in problems)} failed, {warned} warning{'' if warned == 1 else 's'}",
                  verdict, VERDICT_TEXT.get(verdict, verdict.upper()), record.get("out"))


def _badge(text: str, style: str | None = None) -> str:
    return f"[{style or BADGE_STYLE.get(text, '')}]{text:<7}[/]"


def _rank(row: dict[str, Any]) -> str:
    return f"rank {row['rank']}" if row.get("rank") is not None else ""


def _run(row: dict[str, Any]) -> str:
    """The node's own stored run, shown with `gpuvet show N` on that node."""
    return f"run {row['saved_run']}" if row.get("saved_run") is not None else ""


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _header_text(record: dict[str, Any]) -> tuple[str, str]:
    nodes = record.get("nodes") or []
    counts = {state: sum(n.get("status") == state for n in nodes) for state in ("ok", "failed", "missing", "stopped")}
    launcher = record.get("launcher") or {}
    when = (record.get("started_at") or "").replace("T", " ")[:16]
    parts = [_plural(len(nodes), "node"), f"{counts['ok']} reported"]
    parts += [f"{counts[s]} {s}" for s in ("failed", "missing", "stopped") if counts[s]]
    return (f"gpuvet cluster {record.get('cluster_id') or ''}".strip(),
            f"{', '.join(parts)} · {launcher.get('kind', '?')} · {when} UTC · {float(record.get('duration_s') or 0):.1f} s")


def _straggler_lines(record: dict[str, Any], verbose: bool) -> tuple[list[str], list[tuple[str, str, str, str]], int]:
    summary = record.get("summary") or {}
    baselines, stragglers = summary.get("baselines") or [], summary.get("stragglers") or []
    lines = []
    for b in baselines:
        scope = "per GPU" if b["scope"] == "gpu" else f"per node ({b['scope']})"
        lines.append(f"{b['metric']:<22} {number(b['value'])} {b['unit']} {scope}, threshold {100 * b['threshold']:.0f}% "
                     f"(from {b['kept']} of {b['total']} values)")
    shown = stragglers if verbose else stragglers[:STRAGGLERS_SHOWN]
    items = [(s["status"], f"{s['node']} {s['subject']}".strip(), s["metric"],
              f"{number(s['value'])} {s['unit']} = {100 * s['share']:.0f}% of {number(s['baseline'])}") for s in shown]
    return lines, items, len(stragglers) - len(shown)


def _uniformity_lines(record: dict[str, Any], verbose: bool) -> list[tuple[str, str]]:
    lines = []
    for r in (record.get("summary") or {}).get("uniformity") or []:
        if r.get("value") is None:
            continue
        if not r["odd"]:
            unknown = f" ({r['unknown']} did not report it)" if r.get("unknown") else ""
            everywhere = f"on all {r['count']} nodes" if r["count"] > 1 else "on the one node that reported"
            lines.append(("✓", f"{r['field']:<14} {r['value']} {everywhere}{unknown}"))
            continue
        odd = "; ".join(f"{value} on {_names(nodes, verbose)}" for value, nodes in r["odd"].items())
        mark = "✗" if r["field"] in ("GPU model", "GPU count") else "!"
        lines.append((mark, f"{r['field']:<14} {r['value']} on {r['count']} nodes; {odd}"))
    return lines


def _names(nodes: list[str], verbose: bool, limit: int = 8) -> str:
    if verbose or len(nodes) <= limit:
        return ", ".join(nodes)
    return ", ".join(nodes[:limit]) + f" and {len(nodes) - limit} more"


_CROSS_CHECKS = ("cluster.fallback", "cluster.allreduce", "cluster.ring")


def _cross_lines(record: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The plan, then the fallback warning, the all-reduce with its sizes under it, then the ring."""
    cross = record.get("cross_node") or {}
    findings = [f for f in record.get("findings") or [] if f["check"] in _CROSS_CHECKS]
    if not findings and not cross:
        return []
    lines: list[tuple[str, str, str]] = []
    plan = cross.get("plan") or {}
    if plan.get("members"):
        lines.append(("plan", "", f"{len(plan['members'])} nodes x {plan.get('ranks_per_node', '?')} ranks, "
                                  f"{plan.get('backend')} on {plan.get('device')}; {len(plan.get('rounds') or [])} shuffled ring rounds"))
    busbw = next((m for m in cross.get("measurements") or [] if m["name"] == "cluster.allreduce.busbw"), None)
    for check in _CROSS_CHECKS:
        for f in findings:
            if f["check"] == check and (check != "cluster.ring" or f["subject"] == "cluster"):
                lines.append(("finding", f["status"], f["summary"]))
        if check == "cluster.allreduce":
            for row in (busbw or {}).get("details", {}).get("sizes") or []:
                lines.append(("size", "", f"{_size(row['bytes']):>9}  {row['time_us']:>10.1f} us  algbw {row['algbw_gbps']:.3g} GB/s  "
                                          f"busbw {row['busbw_gbps']:.3g} GB/s"))
    return lines


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _problem_items(record: dict[str, Any]) -> list[dict[str, str]]:
    found = [f for f in record.get("findings") or [] if f["status"] in (FAIL, WARN)]
    found.sort(key=lambda f: f["status"] != FAIL)
    items = []
    for f in found:
        subject = "" if f["summary"].startswith(f["subject"]) else f"{f['subject']}: "
        evidence = {} if f["check"] in _FIGURES_SHOWN_ELSEWHERE else f.get("evidence") or {}
        parts = [f"{key} {evidence[key]}" for key in ("measured", "expected") if evidence.get(key)]
        items.append({"status": f["status"], "check": f["check"], "text": f"{subject}{f['summary']}",
                      "evidence": " · ".join(parts), "remedy": f.get("remedy") or ""})
    return items

