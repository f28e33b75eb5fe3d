"""The evidence pack (`gpuvet report RUN --for-provider`): what a renter sends the provider about a
faulty machine, in Markdown (a ticket) or one HTML page.

The failing findings first, each with the GPU it concerns (UUID, serial, bus id, VBIOS: how the
provider finds the card), the evidence, the exact lines of the captures it rests on, the command
that reproduces the figure on the machine, and what we ask for, by the finding's action
(actions.py). The renter's side is removed (provider_redact.py). The capture's own time and age
are given: a record made by `gpuvet inspect` is dated when it was inspected.

The caller reads the capture files (report/ touches no file) and passes their text."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .. import actions
from ..facts import Gpu
from ..record import FAIL, WARN, Finding, RunRecord, parse_timestamp
from .html import CSS as PAGE_STYLE  # the run report's page style: the pack reads like it
from .markdown import same_problems
from .provider_redact import ProviderRedaction
from .terminal import problems, subject_range

EXCERPT_LINES = 12  # per capture and finding: the lines a reader checks, not the capture again

# The lines of a capture each check rests on (nvidia-smi -q and -q -x, lspci -vv, kernel logs).
_EXCERPT = {
    "gpu.power_limit": r"power.?limit|power_limit|power draw|power_draw",
    "gpu.throttle": r"slowdown|brake|power.?cap|clocks.?event|throttle|clocks_event|clocks_throttle",
    "gpu.throttle_history": r"slowdown|brake|clocks.?event|throttle|violation",
    "gpu.temperature": r"temp|slowdown",
    "gpu.fan_failure": r"fan|temp",
    "gpu.pcie_link": r"link|gen|width|lnkcap|lnksta",
    "gpu.pcie_under_load": r"link|gen|width|lnkcap|lnksta",
    "gpu.pcie_driver_view": r"link|gen|width|lnkcap|lnksta",
    "gpu.ecc": r"ecc|retired|remap|pending|uncorr|error",
    "gpu.xid": r"xid|nvrm|aer|fallen off|rminitadapter|reset",
    "gpu.link_errors": r"replay|aer|error",
    "gpu.nvlink": r"nvlink|link \d|inactive",
    "gpu.isolation": r"process|used|util|virtualization|vgpu|mig|driver in use|kernel driver",
    "gpu.model": r"product name|fb memory|total|board part",
    "gpu.uniform": r"product name|power.?limit|vbios|total|link",
    "gpu.persistence": r"persistence",
}

# On the machine: the command that shows the figure again (BUS: the GPU's PCI bus id).
_REPRODUCE = {
    "gpu.power_limit": "nvidia-smi -q -d POWER -i BUS",
    "gpu.throttle": "nvidia-smi -q -d PERFORMANCE -i BUS",
    "gpu.throttle_history": "nvidia-smi -q -d PERFORMANCE -i BUS",
    "gpu.temperature": "nvidia-smi -q -d TEMPERATURE -i BUS",
    "gpu.fan_failure": "nvidia-smi --query-gpu=pci.bus_id,fan.speed,temperature.gpu --format=csv -i BUS",
    "gpu.pcie_link": "nvidia-smi --query-gpu=pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
                     "pcie.link.width.max --format=csv -i BUS; sudo lspci -vv -s BUS | grep -E 'LnkCap|LnkSta'",
    "gpu.ecc": "nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER -i BUS",
    "gpu.xid": "sudo dmesg -T | grep -E 'NVRM: (Xid|GPU)|fallen off the bus|RmInitAdapter'",
    "gpu.link_errors": "nvidia-smi -q -i BUS | grep -i -A2 replay; nvidia-smi nvlink -e",
    "gpu.nvlink": "nvidia-smi nvlink -s; nvidia-smi topo -m",
    "gpu.isolation": "nvidia-smi --query-compute-apps=gpu_bus_id,pid,used_memory --format=csv; nvidia-smi -q -d UTILIZATION,MEMORY -i BUS",
    "gpu.model": "nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id,vbios_version --format=csv",
    "gpu.uniform": "nvidia-smi --query-gpu=index,name,memory.total,power.limit,pci.bus_id,vbios_version --format=csv",
    "gpu.persistence": "nvidia-smi -q -i BUS | grep -i persistence",
}
_REPRODUCE["gpu.pcie_under_load"] = _REPRODUCE["gpu.pcie_driver_view"] = _REPRODUCE["gpu.pcie_link"]

# What we ask the provider for, by the finding's action; a few checks ask for something precise.
_ASK_BY_CHECK = {
    "gpu.power_limit": "Restore this GPU's power limit to its default ({expected}) on the host, or move us to a GPU "
                       "that runs at its default limit.",
    "gpu.pcie_link": "Fix this GPU's PCIe link (reseat the card or its riser, or use a slot of the card's width and "
                     "generation) so it trains at its maximum, or move us to another machine.",
    "gpu.throttle": "Fix what slows this GPU down (cooling, airflow, power delivery) or give us another GPU; we ask "
                    "not to be billed for the hours it ran slowed down.",
    "gpu.temperature": "Fix the cooling of this GPU (fans, airflow, the room) or give us another GPU.",
    "gpu.fan_failure": "Replace the failed fan, or give us another GPU.",
    "gpu.isolation": "Give us the whole GPU we rented: stop the processes we did not start on it, or move us to a GPU "
                     "nobody else uses.",
    "gpu.model": "Give us the GPU model we rented, or refund the difference.",
}
_ASK_BY_CHECK["gpu.pcie_under_load"] = _ASK_BY_CHECK["gpu.pcie_driver_view"] = _ASK_BY_CHECK["gpu.pcie_link"]
_ASK_BY_ACTION = {
    actions.ASK_PROVIDER: "Change this limit set outside our machine, or move us to another machine.",
    actions.RESET_GPU: "Reset this GPU (nvidia-smi -r on the host, or a reboot) and replace it if the errors come back.",
    actions.REBOOT_NODE: "Reboot the node, and take it out of service if this comes back.",
    actions.DRAIN_AND_REPAIR: "Take this GPU out of service for repair (RMA) and move us to another machine; we ask not "
                              "to be billed for the time it cost.",
}
OURS = "Ours to fix (no request to the provider): "


@dataclass
class Excerpt:
    capture: str  # its file name
    lines: list[tuple[int, str]]  # (line number, the line as captured)


@dataclass
class Item:
    """One problem (on one GPU, or the same on several) as the provider reads it."""

    status: str
    check: str
    subject: str
    summary: str
    measured: str | None
    expected: str | None
    source: str | None
    gpus: list[Gpu]
    ask: str
    reproduce: str
    excerpts: list[Excerpt] = field(default_factory=list)


@dataclass
class Pack:
    title: str
    when: list[str]  # the capture's own time and age, the run's, the pack's
    gpus: list[Gpu]
    driver: str
    items: list[Item]
    captures: dict[str, str]  # file name -> its text (redacted), for the HTML page's appendix
    missing: list[str]  # captures named by the record but not readable now
    record_json: str = ""  # the run record as the provider gets it: every fact and figure behind the findings


def build(record: RunRecord, captures: dict[str, str | None], benchmarks: dict[str, str | None],
          now: datetime | None = None) -> Pack:
    """The pack of `record` (any run record); `captures`: each capture path of the record -> its
    text (None: not readable now); `benchmarks`: check id -> the benchmark that measures it."""
    redaction = ProviderRedaction(record, [text for text in captures.values() if text is not None])
    clean = redaction.record()
    texts = {_name(path): redaction.text(text) for path, text in captures.items() if text is not None}
    missing = [_name(path) for path, text in captures.items() if text is None]
    items = [_item(same, clean, texts, benchmarks) for same in same_problems(problems(clean.findings))]
    items.sort(key=lambda i: (i.status != FAIL, _ours(i)))  # failures, then warnings; ours last
    m = clean.machine
    driver = " · ".join(x for x in (m.driver.version and f"driver {m.driver.version}",
                                     m.driver.cuda_version and f"CUDA {m.driver.cuda_version}") if x)
    return Pack(title=f"Evidence for the provider: {_gpu_names(m.gpus) or 'no GPU'}", when=_when(clean, now),
                gpus=m.gpus, driver=driver, items=items, captures=texts, missing=missing, record_json=clean.to_json())


def _ours(item: Item) -> bool:
    return item.ask.startswith(OURS)


def _name(path: str) -> str:
    return path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or path


def _gpu_names(gpus: list[Gpu]) -> str:
    names: dict[str, int] = {}
    for g in gpus:
        names[g.name or "unknown GPU"] = names.get(g.name or "unknown GPU", 0) + 1
    return ", ".join(f"{n} x {name}" for name, n in names.items())


_TAKEN = re.compile(r"taken (?P<when>.+?) by its own timestamp, (?P<age>[^;]+)")


def _when(record: RunRecord, now: datetime | None) -> list[str]:
    """The capture's own time first: it is when the machine was as described."""
    now = now or datetime.now(timezone.utc)
    lines = []
    for entry in record.machine.captures:
        found = _TAKEN.search(entry.get("note") or "")
        if found:
            lines.append(f"{_name(entry['path'])}: captured {found['when']} (the capture's own timestamp), "
                         f"{found['age']}")
    try:
        started: datetime | None = parse_timestamp(record.started_at)
    except ValueError:
        started = None
    made = "inspected (judged from captures)" if record.machine.source == "capture" else "measured on the machine"
    if started is not None:
        started = started if started.tzinfo else started.replace(tzinfo=timezone.utc)
        days = (now - started).total_seconds() / 86400
        age = "today" if days < 1 else f"{days:.0f} days ago"
        lines.append(f"{made} {started:%Y-%m-%d %H:%M} UTC ({age})")
    lines.append(f"this pack made {now:%Y-%m-%d %H:%M} UTC")
    return lines


def _item(same: list[Finding], record: RunRecord, texts: dict[str, str], benchmarks: dict[str, str | None]) -> Item:
    f = same[0]
    subjects = list(dict.fromkeys(x.subject for x in same))
    gpus = _gpus_of(subjects, record.machine.gpus)
    e = f.evidence
    return Item(status=f.status, check=f.check, subject=subject_range(subjects), summary=f.summary, measured=e.measured,
                expected=e.expected, source=e.source, gpus=gpus, ask=_ask(f), reproduce=_reproduce(f, gpus, benchmarks),
                excerpts=_excerpts(f.check, gpus, texts))


def _gpus_of(subjects: list[str], gpus: list[Gpu]) -> list[Gpu]:
    indexes = {int(s[3:]) for s in subjects if re.fullmatch(r"gpu\d+", s)}
    return [g for g in gpus if g.index in indexes]


def _ask(f: Finding) -> str:
    action = f.action or actions.NONE
    if action not in _ASK_BY_ACTION:
        return OURS + (f.remedy or "see the finding")
    ask = _ASK_BY_CHECK.get(f.check) if action == actions.ASK_PROVIDER else None
    return (ask or _ASK_BY_ACTION[action]).replace("{expected}", f.evidence.expected or "the default")


def _reproduce(f: Finding, gpus: list[Gpu], benchmarks: dict[str, str | None]) -> str:
    if benchmarks.get(f.check):
        return f"gpuvet bench {benchmarks[f.check]}"
    command = _REPRODUCE.get(f.check, "gpuvet run --quick")
    buses = [g.pcie.bus_id for g in gpus if g.pcie.bus_id]
    return command.replace("BUS", ",".join(buses)) if buses else command.replace(" -i BUS", "").replace(" -s BUS", "")


def _excerpts(check: str, gpus: list[Gpu], texts: dict[str, str]) -> list[Excerpt]:
    pattern = _EXCERPT.get(check)
    if not pattern:
        return []
    wanted = re.compile(pattern, re.I)
    buses = {_short_bus(g.pcie.bus_id) for g in gpus if g.pcie.bus_id}
    found = []
    for name, text in texts.items():
        lines = [(n, line) for n, line in _sections(text, buses) if wanted.search(line)]
        if lines:
            found.append(Excerpt(name, lines[:EXCERPT_LINES]))
    return found


_GPU_HEADER = re.compile(r'^(?:GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$|\s*<gpu id="([^"]+)">)')
_BUS_ANYWHERE = re.compile(r"([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)")


def _short_bus(bus_id: str) -> str:
    return bus_id.lower()[-7:]  # "53:00.0": nvidia-smi writes 8 digits of domain, lspci 4 or none


def _sections(text: str, buses: set[str]) -> list[tuple[int, str]]:
    """The numbered lines of the GPUs `buses` names: an nvidia-smi report's sections of those GPUs,
    other captures' lines naming their bus ids, or everything where no GPU is named."""
    lines = list(enumerate(text.splitlines(), start=1))
    if not buses:
        return lines
    headers = [(n, (m.group(1) or m.group(2)).lower()[-7:]) for n, line in lines for m in [_GPU_HEADER.match(line)] if m]
    if headers:
        keep, current = [], None
        starts = dict(headers)
        for n, line in lines:
            current = starts.get(n, current)
            if current in buses:
                keep.append((n, line))
        return keep
    naming = [(n, line) for n, line in lines if {b.lower()[-7:] for b in _BUS_ANYWHERE.findall(line)} & buses]
    return naming or lines


# -- Markdown --------------------------------------------------------------------------------------

def _md(text: str | None) -> str:
    """Text in a Markdown line: its markup characters escaped, one line."""
    return re.sub(r"([\\`*_\[\]<>|#])", r"\\\1", " ".join((text or "").split()))


def _code(text: str) -> str:
    """An inline code span that holds any text: more backticks around it than it has in a row."""
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if "`" in text else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _fence(lines: list[str]) -> str:
    body = "\n".join(lines)
    ticks = "`" * max(3, max((len(run) + 1 for run in re.findall(r"`{3,}", body)), default=3))
    return f"{ticks}text\n{body}\n{ticks}"


def _identity(g: Gpu) -> str:
    return (f"gpu{g.index} {g.name or 'unknown GPU'} · UUID {g.uuid or '?'} · serial {g.serial or '?'} · "
            f"bus id {g.pcie.bus_id or '?'} · VBIOS {g.vbios or '?'}")


def render_markdown(pack: Pack) -> str:
    out = [f"# {_md(pack.title)}", ""]
    out += [f"- {_md(line)}" for line in pack.when]
    if pack.driver:
        out.append(f"- {_md(pack.driver)}")
    out += ["", "## The GPUs (as the driver names them)", ""]
    out += [f"- {_md(_identity(g))}" for g in pack.gpus] or ["- no GPU was read"]
    for n, item in enumerate(pack.items, start=1):
        out += ["", f"## {n}. {item.status.upper()}: {_md(item.summary)}", ""]
        out.append(f"- check {_code(item.check)} on {_md(item.subject)}")
        out += [f"- {_md(_identity(g))}" for g in item.gpus]
        out += [f"- {label}: {_md(value)}" for label, value in
                (("measured", item.measured), ("expected", item.expected), ("source", item.source)) if value]
        out.append(f"- reproduce on the machine: {_code(item.reproduce)}")
        for excerpt in item.excerpts:
            out += ["", f"From {_md(excerpt.capture)}:", "", _fence([f"{n:>6}: {line}" for n, line in excerpt.lines])]
        out += ["", f"**What we ask for.** {_md(item.ask)}"]
    if not pack.items:
        out += ["", "No failing or warning finding: nothing to ask the provider for."]
    if pack.captures or pack.missing:
        out += ["", "## Captures", ""]
        out += [f"- {_md(name)}: attach it whole to the ticket" for name in pack.captures]
        out += [f"- {_md(name)}: no longer at its path here; attach it from where it is kept" for name in pack.missing]
    out += ["", "Made by gpuvet. The renter's host names, user names, addresses and paths are removed; the GPUs' "
                "identity is kept so that the provider can find them."]
    return "\n".join(out) + "\n"


# -- HTML --------------------------------------------------------------------------------------------

def _e(text: object) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def render_html(pack: Pack) -> str:
    parts = [f"<h1>{_e(pack.title)}</h1>", "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in pack.when)
             + (f"<li>{_e(pack.driver)}</li>" if pack.driver else "") + "</ul>",
             "<h2>The GPUs (as the driver names them)</h2>", _gpu_table(pack.gpus)]
    for n, item in enumerate(pack.items, start=1):
        status = "fail" if item.status == FAIL else "warn" if item.status == WARN else "skip"
        rows = "".join(f"<dt>{label}</dt><dd>{_e(value)}</dd>" for label, value in
                       (("check", f"{item.check} on {item.subject}"), ("measured", item.measured),
                        ("expected", item.expected), ("source", item.source)) if value)
        excerpts = "".join(f"<p>From <code>{_e(x.capture)}</code>:</p><pre>"
                           + "\n".join(f"{n:>6}: {_e(line)}" for n, line in x.lines) + "</pre>" for x in item.excerpts)
        parts.append(f'<article class="finding {status}" id="finding-{n}"><h3>{n}. {_e(item.status.upper())}: '
                     f"{_e(item.summary)}</h3>{_gpu_table(item.gpus) if item.gpus else ''}<dl class=\"facts\">{rows}</dl>"
                     f"<p>Reproduce on the machine: <code>{_e(item.reproduce)}</code></p>{excerpts}"
                     f'<p class="ask"><strong>What we ask for.</strong> {_e(item.ask)}</p></article>')
    if not pack.items:
        parts.append("<p>No failing or warning finding: nothing to ask the provider for.</p>")
    if pack.captures or pack.missing:
        parts.append("<h2>Captures</h2>")
        parts += [f"<details><summary>{_e(name)} (whole)</summary><pre>{_e(text)}</pre></details>"
                  for name, text in pack.captures.items()]
        parts += [f"<p><code>{_e(name)}</code>: no longer at its path here; attach it from where it is kept.</p>"
                  for name in pack.missing]
    parts.append("<h2>The run record</h2><details><summary>Every fact and figure gpuvet read (JSON, gpuvet.run/1)"
                 f"</summary><pre>{_e(pack.record_json)}</pre></details>")
    parts.append("<footer>Made by gpuvet. The renter's host names, user names, addresses and paths are removed; the "
                 "GPUs' identity is kept so that the provider can find them.</footer>")
    return ("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_e(pack.title)}</title>\n<style>{PAGE_STYLE}</style>\n</head>\n<body>\n<main>\n"
            + "\n".join(parts) + "\n</main>\n</body>\n</html>\n")


def _gpu_table(gpus: list[Gpu]) -> str:
    if not gpus:
        return "<p>No GPU was read.</p>"
    rows = "".join(f"<tr><td>gpu{g.index}</td><td>{_e(g.name)}</td><td><code>{_e(g.uuid)}</code></td><td>{_e(g.serial)}</td>"
                   f"<td><code>{_e(g.pcie.bus_id)}</code></td><td>{_e(g.vbios)}</td></tr>" for g in gpus)
    return ("<table><thead><tr><th>GPU</th><th>Model</th><th>UUID</th><th>Serial</th><th>Bus id</th><th>VBIOS</th></tr>"
            f"</thead><tbody>{rows}</tbody></table>")
