"""Reading `nvidia-smi nvlink -s` (`--status`): which NVLinks of each GPU are up, and how fast.

    GPU 3: Tesla V100-SXM2-32GB (UUID: GPU-50b1bd2e-...)
             Link 0: 25.781 GB/s
             Link 3: <inactive>

A GPU without links gets one line of explanation instead of Link lines; seen in real captures:
    NVML: Unable to retrieve NVLink information as all links are inactive   (also "Nvlink ... inActive")
    Device does not have or support Nvlink
    Nvlink queries are not supported for Devices in MIG mode
That line is kept verbatim as the GPU's `note`, with `links` empty: read the note before taking an
empty list as "no NVLink" (in MIG mode the links were not read at all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuvet.facts import NvLink
from gpuvet.probe import values
from gpuvet.untrusted_text import quote
from gpuvet.probe.bounded_read import check_gpu_count, check_gpu_index
from gpuvet.probe.errors import CaptureError

# Matched against lines with their trailing whitespace cut (see gpu_blocks, _read_gpu_line): a
# lazy ".*?" before "\s*$" backtracked quadratically on a run of spaces (20,000 spaces, 6 s).
_GPU_LINE = re.compile(r"GPU (\d+): (.*)\(UUID: ([^)]+)\)$")
_LINK_LINE = re.compile(r"\s*Link (\d+): (.*)$")
_SPEED = re.compile(r"(\d+(?:\.\d+)?)\s*GB/s")


@dataclass
class NvlinkStatus:
    """One GPU's block of `nvidia-smi nvlink -s`."""

    index: int
    name: str | None = None
    uuid: str | None = None
    links: list[NvLink] = field(default_factory=list)  # in the order printed
    note: str | None = None  # what nvidia-smi printed instead of links, verbatim


def looks_like_nvlink_status(text: str) -> bool:
    """True when the text starts with a "GPU n: ... (UUID: ...)" line followed by a Link or NVLink line.

    The second line tells it apart from `nvidia-smi -L`, whose GPU lines look the same.
    """
    lines = [line.rstrip() for line in text[:4096].splitlines() if line.strip()][:2]
    return (
        len(lines) == 2
        and _GPU_LINE.match(lines[0]) is not None
        and (_LINK_LINE.match(lines[1]) is not None or "nvlink" in lines[1].lower())
    )


def parse_nvlink_status(text: str) -> list[NvlinkStatus]:
    """One NvlinkStatus per GPU, in the order printed.

    Lines before the first GPU line (a shell prompt) are skipped. Afterwards every line must be a
    GPU line, a Link line or the one explanation line right under a GPU line; anything else raises
    CaptureError, because it means the text is not (only) `nvlink -s` output.
    """
    gpus: list[NvlinkStatus] = []
    for match, lines in gpu_blocks(text, _GPU_LINE, "nvlink -s"):
        gpu = NvlinkStatus(index=int(match.group(1)), name=values.cut(match.group(2).rstrip()), uuid=values.cut(match.group(3)))
        for line in lines:
            _read_gpu_line(line, gpu)
        gpus.append(gpu)
    if not gpus:
        raise CaptureError(
            "expected `nvidia-smi nvlink -s` output (lines 'GPU 0: NAME (UUID: GPU-...)' with "
            f"'Link N: ...' under them); found {describe(text)}"
        )
    return gpus


def _read_gpu_line(line: str, gpu: NvlinkStatus) -> None:
    link = _LINK_LINE.match(line.rstrip())
    number = values.whole(link.group(1)) if link else None
    if link and number is not None:
        gpu.links.append(_link(number, link.group(2).strip()))
    elif not gpu.links and gpu.note is None:
        gpu.note = line.strip()
    else:
        raise CaptureError(
            f"unexpected line {quote(line.strip())} among the links of GPU {gpu.index} in "
            "`nvidia-smi nvlink -s` output"
        )


def _link(number: int, value: str) -> NvLink:
    """ "25.781 GB/s" -> active at that speed; "<inactive>" (or anything without a speed) -> inactive."""
    speed = _SPEED.search(value)
    if speed and "inactive" not in value.lower():
        return NvLink(link=number, active=True, speed_gbs=values.number(speed.group(1)))
    return NvLink(link=number, active=False)


def gpu_blocks(text: str, gpu_line: re.Pattern[str], command: str) -> list[tuple[re.Match[str], list[str]]]:
    """Each "GPU n: ..." line of an `nvidia-smi nvlink` output (its match) with the non-blank lines
    under it, in the order printed. Lines before the first GPU line (a shell prompt) are skipped;
    the GPU indexes and their number are bounded here."""
    blocks: list[tuple[re.Match[str], list[str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        gpu = gpu_line.match(line.rstrip())
        if gpu:
            check_gpu_index(values.whole(gpu.group(1)), f"this `{command}` output")
            blocks.append((gpu, []))
            check_gpu_count(len(blocks), f"this `{command}` output")
        elif blocks:
            blocks[-1][1].append(line)
    return blocks


def describe(text: str) -> str:
    """The first line of a text that is not the output expected, for the error message."""
    stripped = text.strip()
    return quote(stripped.splitlines()[0]) if stripped else "an empty text"
