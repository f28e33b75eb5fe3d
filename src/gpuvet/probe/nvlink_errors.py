"""Reading `nvidia-smi nvlink -e` (`--errorcounters`): each NVLink's error counters, per GPU.

    GPU 0: NVIDIA GB300                     (the links are tab-indented)
      Link 0: Replay Errors: 0
      Link 0: Recovery Errors: 0
      Link 0: CRC Errors: 0

Drivers before Blackwell print Replay, Recovery and CRC Errors per link. Blackwell's NVLink 5 has
other counters (DCGM's NVLink 5 health watch reads them: Rx errors, malformed and dropped packets,
link integrity errors, link recovery events, effective and symbol errors), printed beside counts
that are no fault: packets and bytes, FEC histogram bins (corrected codewords), bit error rates,
raw per-lane counts. Every "Link N: NAME: VALUE" line is kept under its link; `is_error_counter`
says which of them count link faults.

The GPU line may carry "(UUID: ...)" or not (the NVIDIA srt-slurm docs print it without). A GPU
whose links were not read gets one line of explanation instead (as in `nvlink -s`); it is kept as
the GPU's `note`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..untrusted_text import quote
from . import values
from .errors import CaptureError
from .nvlink_status import describe, gpu_blocks

# Matched against lines with their trailing whitespace cut: see nvlink_status._GPU_LINE. The GPU
# name stops at its last non-space before an optional "(UUID: ...)" (no lazy ".*?\s*" pair).
_GPU_LINE = re.compile(r"GPU (\d+): (?:(.*\S)\s*\(UUID: ([^)]+)\)|(.*))$")
_COUNTER_START = re.compile(r"\s*Link (\d+): ")
_MAX_LINK = 1024  # NVLink counts are tens per GPU; a larger number is a damaged line

# Names that count something else than a fault, or are a rate, or a bin of corrected codewords.
_NOT_FAULTS = re.compile(r"packets|bytes|^fec errors|\bber\b|^raw |successful")


@dataclass
class NvlinkErrors:
    """One GPU's block of `nvidia-smi nvlink -e`."""

    index: int
    name: str | None = None
    uuid: str | None = None
    # link number -> counter name as printed -> value (an integer count, or the text printed: a BER)
    links: dict[int, dict[str, int | str]] = field(default_factory=dict)
    note: str | None = None  # what nvidia-smi printed instead of links, verbatim


def is_error_counter(name: str) -> bool:
    """True for the counters that count link faults: Replay/Recovery/CRC Errors (pre-Blackwell) and
    Blackwell's error and discard counters and link recovery events. "Link recovery successful
    events" is left out: "Total link recovery events" counts it already, beside the failed ones."""
    low = name.lower()
    if _NOT_FAULTS.search(low):
        return False
    return "error" in low or "discard" in low or "recovery" in low


def counter_key(name: str) -> str:
    """'Replay Errors' -> 'replay', 'CRC Flit Errors' -> 'crc_flit', 'Link recovery failed events'
    -> 'link_recovery_failed_events': the names the NVML backend gives the same counters."""
    low = name.lower().strip()
    if low.endswith(" errors"):
        low = low[: -len(" errors")]
    return re.sub(r"[^a-z0-9]+", "_", low).strip("_")


def looks_like_nvlink_errors(text: str) -> bool:
    """True when the text starts with a "GPU n: NAME" line and a "Link n: COUNTER: VALUE" line comes
    soon after: under the first GPU, or under a later one when the first GPU printed only a note
    ("all links are inactive"). `nvlink -s` Link lines ("Link 0: 25.781 GB/s") have no counter name."""
    lines = [line.rstrip() for line in text[:4096].splitlines() if line.strip()][:40]
    return bool(lines) and _GPU_LINE.match(lines[0]) is not None and any(_counter(line) for line in lines[1:])


def parse_nvlink_errors(text: str) -> list[NvlinkErrors]:
    """One NvlinkErrors per GPU, in the order printed.

    Lines before the first GPU line (a shell prompt) are skipped; blank lines between links are
    what nvidia-smi prints. Afterwards every line must be a GPU line, a counter line or the one
    explanation line right under a GPU line; anything else raises CaptureError.
    """
    gpus: list[NvlinkErrors] = []
    for match, lines in gpu_blocks(text, _GPU_LINE, "nvlink -e"):
        name = (match.group(2) or match.group(4) or "").strip()
        gpu = NvlinkErrors(index=int(match.group(1)), name=values.cut(name) or None, uuid=match.group(3) and values.cut(match.group(3)))
        for line in lines:
            _read_line(line, gpu)
        gpus.append(gpu)
    if not gpus:
        raise CaptureError("expected `nvidia-smi nvlink -e` output (lines 'GPU 0: NAME' with "
                           f"'Link N: Replay Errors: 0' under them); found {describe(text)}")
    return gpus


def _counter(line: str) -> tuple[str, str, str] | None:
    """ "  Link 0: Replay Errors: 0" -> ("0", "Replay Errors", "0"); None for any other line."""
    start = _COUNTER_START.match(line)
    if not start:
        return None
    name, colon, value = line[start.end():].partition(": ")
    value = value.strip()
    if not colon or not name or not value:
        return None
    return start.group(1), name, value


def _read_line(line: str, gpu: NvlinkErrors) -> None:
    counter = _counter(line)
    if counter:
        link = values.whole(counter[0])
        if link is None or link > _MAX_LINK:
            raise CaptureError(f"link {quote(counter[0], 30, quotes=False)} of GPU {gpu.index} in `nvidia-smi nvlink -e` "
                               "output: no GPU has that many NVLinks")
        count = values.whole(counter[2])
        gpu.links.setdefault(link, {})[counter[1]] = count if count is not None else counter[2][:120]
    elif not gpu.links and gpu.note is None:
        gpu.note = line.strip()
    else:
        raise CaptureError(f"unexpected line {quote(line.strip())} among the links of GPU {gpu.index} "
                           "in `nvidia-smi nvlink -e` output")


def error_counts(gpu: NvlinkErrors) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """(counter key -> sum over the links, link -> counter key -> count where it is not 0), fault
    counters only: the facts `Gpu.nvlink_errors` and `Gpu.nvlink_error_links`."""
    totals: dict[str, int] = {}
    by_link: dict[str, dict[str, int]] = {}
    for link, counters in sorted(gpu.links.items()):
        for name, value in counters.items():
            if not isinstance(value, int) or not is_error_counter(name):
                continue
            key = counter_key(name)
            totals[key] = totals.get(key, 0) + value
            if value:
                by_link.setdefault(str(link), {})[key] = value
    return totals, by_link
