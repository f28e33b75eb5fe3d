"""Redaction for the provider: the renter's side removed (hostnames, users, IP and MAC addresses,
local file paths), the GPU's identity kept (UUID, serial, PCI bus id, VBIOS), since the provider
needs it to find the card.

report/redact.py removes GPU UUIDs and serials with everything else (to share in public); here its
Redactor does the work and the GPU's own UUIDs and serials are put back, by the tokens it gave
them. Paths outside the system's own trees are cut to their file name: a capture kept in
/home/alice/tickets/q.txt names a user and a folder layout the provider has no use for."""

from __future__ import annotations

import re
from typing import Any, Sequence

from ..record import RunRecord
from .redact import Redactor

_TOKEN = re.compile(r"\b(?:GPU|MIG|UUID|SERIAL)-REDACTED-\d+\b")
# System trees whose paths say what was read, not whose machine it was.
_SYSTEM_ROOTS = ("dev", "proc", "sys", "usr", "etc", "lib", "lib64", "opt", "bin", "sbin", "run", "var")
# A syslog or `journalctl` line names its host after the time: "Dec  2 11:49:53 worker4 kernel: ...".
_LOG_HOST = re.compile(r"^((?:\w{3} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:?\d\d|Z)?) )"
                       r"(?!kernel:)([\w.-]+)( [\w.-]+(?:\[\d+\])?:)", re.M)
_PATH = re.compile(r"(?<![\w.~:/-])(?:~|\.{1,2})?/(?!(?:%s)(?:/|\b))[^\s'\"`,;()<>\[\]]+" % "|".join(_SYSTEM_ROOTS))


class ProviderRedaction:
    """Learns a record's identifying values once; `.record()` and `.text()` give what the provider sees."""

    def __init__(self, record: RunRecord, captures: Sequence[str] = ()):
        self._data = record.to_dict()
        self._redactor = Redactor()
        # The hosts the captures' log lines name, wherever else they appear (a finding quoting one).
        hosts = {m.group(2) for text in captures for m in _LOG_HOST.finditer(text)}
        self._redactor.learn([self._data, *({"hostname": host} for host in sorted(hosts))])
        self._kept: dict[str, str] = {}
        for gpu in self._data.get("machine", {}).get("gpus", []):
            uuid, serial = (gpu.get("uuid") or "").strip(), (gpu.get("serial") or "").strip()
            if uuid:
                prefix = uuid.split("-", 1)[0].upper()
                self._kept[self._redactor.token(prefix if prefix in ("GPU", "MIG") else "UUID", uuid)] = uuid
            if serial:
                self._kept[self._redactor.token("SERIAL", serial)] = serial

    def record(self) -> RunRecord:
        clean = self._walk(self._redactor.walk(self._data))
        clean.setdefault("options", {})["redacted"] = True
        return RunRecord.from_dict(clean)

    def text(self, value: str) -> str:
        """A capture's text (or any text) as the provider gets it; a log line's host is replaced too."""
        value = _LOG_HOST.sub(lambda m: m.group(1) + self._redactor.token("HOST", m.group(2)) + m.group(3), value)
        return self._finish(self._redactor.text(value))

    def _walk(self, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: self._walk(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self._walk(v) for v in data]
        return self._finish(data) if isinstance(data, str) else data

    def _finish(self, text: str) -> str:
        text = _TOKEN.sub(lambda m: self._kept.get(m.group(0), m.group(0)), text)
        return strip_paths(text)


def strip_paths(text: str) -> str:
    """Local file paths cut to their file name ("…/q-8x.txt"); /dev, /proc, /sys, /usr ... stay,
    and so does a top folder alone (/tmp, /data: a mount point, not a person's)."""
    return _PATH.sub(_file_name, text)


def _file_name(match: re.Match[str]) -> str:
    path = match.group(0).rstrip("/")
    if path.startswith("/") and path.count("/") == 1:
        return match.group(0)
    return "…/" + path.rsplit("/", 1)[-1]
