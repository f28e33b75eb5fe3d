"""Fields nvidia-smi could not read: it prints "Unknown Error" where NVML answered with an error
(NVML_ERROR_UNKNOWN, a GPU lost or in trouble). The parsers read such a field as not reported;
in the memory-health sections (ECC counters, retired pages, remapped rows) that would read as "no
errors", so they are listed here per GPU, by PCI bus id, for gpu.ecc to fail (facts.ECC_READ_FAILED)."""

from __future__ import annotations

import re

from . import values as v

READ_FAILED = "Unknown Error"
_TEXT_SECTIONS = ("ECC Mode", "ECC Errors", "Retired Pages", "Page Retirement", "Remapped Rows")
_XML_SECTIONS = ("ecc_mode", "ecc_errors", "retired_pages", "remapped_rows")
_TEXT_GPU = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-7])\s*$")
_XML_GPU = re.compile(r'<gpu id="(?P<bus>[^"]{1,40})">(?P<body>.*?)</gpu>', re.S)
_XML_FAILED = re.compile(rf"<(?P<tag>\w{{1,60}})>\s*{READ_FAILED}\s*</(?P=tag)>")


def in_text(text: str) -> dict[str, list[str]]:
    """`nvidia-smi -q`: bus id -> "ECC Errors > Volatile > DRAM Uncorrectable" for each field that failed."""
    failed: dict[str, list[str]] = {}
    bus: str | None = None
    path: list[tuple[int, str]] = []  # the sections above the line, with their indentation
    for line in text.splitlines():
        m = _TEXT_GPU.match(line)
        if m:
            bus, path = v.bus_id(m.group("bus")), []
            continue
        if bus is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while path and path[-1][0] >= indent:
            path.pop()
        name, colon, value = line.strip().partition(":")
        if not colon or not value.strip():
            path.append((indent, name.strip()))
        elif value.strip() == READ_FAILED and path and path[0][1] in _TEXT_SECTIONS:
            failed.setdefault(bus, []).append(" > ".join([p[1] for p in path] + [name.strip()]))
    return failed


def in_xml(text: str) -> dict[str, list[str]]:
    """`nvidia-smi -q -x`: bus id -> "ecc_errors/volatile_uncorrectable" style names of the failed fields."""
    failed: dict[str, list[str]] = {}
    for gpu in _XML_GPU.finditer(text):
        bus = v.bus_id(gpu.group("bus"))
        for section in _XML_SECTIONS:
            block = re.search(rf"<{section}>(.*?)</{section}>", gpu.group("body"), re.S)
            if bus and block:
                failed.setdefault(bus, []).extend(f"{section}/{m.group('tag')}" for m in _XML_FAILED.finditer(block.group(1)))
    return {bus: fields for bus, fields in failed.items() if fields}
