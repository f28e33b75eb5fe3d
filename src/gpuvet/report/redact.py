"""Redaction: a copy of a run record fit to share in public.

Removes what identifies a machine or a person: hostnames, serial numbers, UUIDs (GPU-..., MIG-...,
DMI), IP addresses (v4 and v6), MAC addresses, user names in home directories, SSH key comments
and asset tags. Everywhere: facts, findings, measurements' details, capture paths, series.

Every distinct value gets its own numbered token (GPU-REDACTED-1, GPU-REDACTED-2, ...), the
same token wherever the value appears, so "gpu3 is GPU-REDACTED-4" still reads consistently.
Loopback and unspecified addresses (127.0.0.1, ::1, 0.0.0.0, ::) stay: they identify nobody,
and "listening on 0.0.0.0" is the point of a security finding.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import Any

from ..record import RunRecord
from ..text_patterns import HEX

HOST, SERIAL, USER, COMMENT, ASSET, INSTANCE = "HOST", "SERIAL", "USER", "COMMENT", "ASSET", "INSTANCE"

# Fields whose whole value identifies the machine or a person, by key name (any nesting); each value
# is then redacted wherever else it appears (a label, a path, a remedy). "peer": net test's other end;
# "node": a cluster node's name (options.cluster.node), which other nodes' paths and notes may hold.
_FIELD_CATEGORY = {"hostname": HOST, "node": HOST, "nodename": HOST, "node_name": HOST, "peer": HOST,
                   "serial": SERIAL, "comment": COMMENT, "chassis_asset_tag": ASSET, "user": USER, "username": USER,
                   "instance_id": INSTANCE}
_SERIAL_SUFFIXES = ("_serial", "serial_number")

_UUID = rf"{HEX}{{8}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{12}}"
_PREFIXED_UUID = re.compile(rf"\b(GPU|MIG)-{_UUID}\b")
_BARE_UUID = re.compile(rf"(?<![\w-]){_UUID}(?![\w-])")
_MAC = re.compile(rf"(?<![\w:-])(?:{HEX}{{2}}[:-]){{5}}{HEX}{{2}}(?![\w:-])")
# Candidates only: ipaddress decides (so times like 16:41:05 and PCI bus ids stay).
# An IPv6 address, also followed by ":port" (written unbracketed, "2001:db8::7:8080"); the port stays.
_IPV6 = re.compile(rf"(?<![\w:.])(?:{HEX}{{0,4}}:){{2,8}}(?:(?:\d{{1,3}}\.){{3}}\d{{1,3}}|{HEX}{{1,4}})?(?:%[\w-]+)?(?:(?<=\d):\d{{1,5}})?(?![\w:]|\.\w)")
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?!\.?\w)")
# A user's own directory, wherever the home or scratch tree is mounted (/nfs/home/U, /mnt/home/U,
# /scratch/U, /lustre/scratch/U): the name after it is a user's.
_HOME = re.compile(r"(/home/|/Users/|/scratch/|\\Users\\)([^/\\\s'\"`:;,()]+)")
# Names a cloud gives a machine, found in any text (a label, a capture's path): an AWS instance id
# or EC2 host name, a GKE / AKS / EKS node, any name under a private DNS zone (*.internal, *.local, *.lan).
_MACHINE_NAMES = re.compile(
    r"(?<![\w-])(?:i-[0-9a-f]{8}(?:[0-9a-f]{9})?|ip-\d{1,3}-\d{1,3}-\d{1,3}-\d{1,3}(?:\.[\w-]+)*"
    r"|(?:gke|aks|eks)-[\w-]*\d[\w-]*(?:\.[\w-]+)*"
    r"|[A-Za-z0-9][\w-]*(?:\.[\w-]+)*\.(?:internal|local|lan|localdomain|cluster\.local))(?![\w-])")
_MACHINE_LIKE = re.compile(r"(?=[^/]*[A-Za-z])(?=[^/]*\d)[A-Za-z0-9]+(?:[-.][A-Za-z0-9]+)+")
_VERSION_LIKE = re.compile(r"v?\d+(?:[-.]\d+)*(?:[-.][A-Za-z]+\d*)?")  # 535.183.01, 2026-12-03, 1.2-rc1
_TOKEN = re.compile(r"[A-Z0-9]+-REDACTED-\d+")  # what a pass before put there
# Too common as words to redact wherever they appear, when learned as a user's name from a path.
_COMMON_USERS = {"root", "ubuntu", "admin", "user", "users", "shared", "share", "data", "public", "tmp", "home", "ec2-user"}


def redact(record: RunRecord) -> RunRecord:
    """A redacted copy (the record passed in is not changed)."""
    data = record.to_dict()
    redactor = Redactor()
    redactor.learn(data)
    clean = redactor.walk(data)
    clean.setdefault("options", {})["redacted"] = True
    return RunRecord.from_dict(clean)


class Redactor:
    """Two passes: learn the values of identifying fields (so they are also caught in free text,
    e.g. a hostname inside a capture path), then rewrite every string."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, str], str] = {}
        self._counts: dict[str, int] = {}
        self._literals: list[tuple[re.Pattern[str], str, str]] = []  # (pattern, category, canonical value)

    def _literal_token(self, category: str, canonical: str, _match: re.Match[str]) -> str:
        return self.token(category, canonical)

    def token(self, category: str, value: str) -> str:
        key = (category, value.lower() if category in (HOST, "GPU", "MIG", "UUID", "IPV6", "MAC") else value)
        if key not in self._tokens:
            self._counts[category] = self._counts.get(category, 0) + 1
            self._tokens[key] = f"{category}-REDACTED-{self._counts[category]}"
        return self._tokens[key]

    # -- pass 1 ------------------------------------------------------------------------------------

    def learn(self, data: Any) -> None:
        for key, value in _fields(data):
            category = _category(key)
            if category and isinstance(value, str) and value.strip():
                self._learn_literal(category, _host_of(value.strip()) if category == HOST else value.strip())
        # A capture's folder named after the machine it came from ("/data/gpu-node-17/q.xml",
        # "caps/i-0abc.../"): the record of an inspected capture knows no hostname, so a folder of
        # a capture path that reads like a machine's name (letters and digits joined by - or .) is one.
        for key, value in _fields(data):
            if key in ("path", "source") and isinstance(value, str) and "/" in value:
                for folder in value.replace("\\", "/").split("/")[:-1]:
                    if _MACHINE_LIKE.fullmatch(folder) and not _VERSION_LIKE.fullmatch(folder):
                        self._learn_literal(HOST, folder)
        # A user named by a home directory anywhere (a capture's path) is that user wherever else
        # the name appears ("ssh alice@...", "/tmp/alice-ckpt").
        users = {m.group(2) for text in _strings(data) for m in _HOME.finditer(text)}
        for user in sorted(users):
            if len(user) >= 3 and user.lower() not in _COMMON_USERS:
                self._learn_literal(USER, user)
        self._literals.sort(key=lambda item: -len(item[2]))  # "node-17.example.org" before "node-17"

    def _learn_literal(self, category: str, value: str) -> None:
        values = [value]
        if category == HOST and "." in value and not _is_ip(value):
            short = value.split(".", 1)[0]
            if len(short) >= 4:
                values.append(short)  # the short name shows up in prompts and paths
        for v in values:
            if category == HOST and v.lower() in ("localhost", "localhost.localdomain"):
                continue
            if category == SERIAL and len(v) < 6:
                continue  # too short to find in text without hitting other numbers
            # Short hostnames ("vm") are matched case-sensitively, or "kvm VM" would lose a word.
            flags = re.I if category == HOST and len(v) >= 4 else 0
            # A hostname is a word of its own even beside "-" or "_" ("/scratch/gpu-node-17-tmp"),
            # but not beside a letter or digit ("gpu-node-170" is another host).
            edges = (r"(?<![A-Za-z0-9.])", r"(?![A-Za-z0-9])") if category == HOST else (r"(?<![\w-])", r"(?![\w-])")
            pattern = re.compile(rf"{edges[0]}{re.escape(v)}{edges[1]}", flags)
            self._literals.append((pattern, category, value))

    # -- pass 2 ------------------------------------------------------------------------------------

    def walk(self, data: Any, key: str | None = None) -> Any:
        if isinstance(data, dict):
            return {self.text(k) if isinstance(k, str) else k: self.walk(v, k if isinstance(k, str) else None)
                    for k, v in data.items()}
        if isinstance(data, list):
            return [self.walk(v, key) for v in data]
        if isinstance(data, str):
            category = _category(key)
            if category and data.strip():
                return self.token(category, data.strip())
            cleaned = self.text(data)
            if cleaned == data and key and key.lower().endswith("uuid") and data.strip():
                return self.token("UUID", data.strip())  # a UUID in a form the patterns do not know
            return cleaned
        return data

    def text(self, value: str) -> str:
        for pattern, category, canonical in self._literals:
            # A token is numbered when first used: only a literal that occurs gets one.
            value = pattern.sub(functools.partial(self._literal_token, category, canonical), value)
        value = _MACHINE_NAMES.sub(lambda m: self.token(INSTANCE if m.group(0).startswith("i-") else HOST, m.group(0)), value)
        value = _PREFIXED_UUID.sub(lambda m: self.token(m.group(1), m.group(0)), value)
        value = _BARE_UUID.sub(lambda m: self.token("UUID", m.group(0)), value)
        value = _MAC.sub(lambda m: self.token("MAC", m.group(0).replace("-", ":")), value)
        value = _IPV6.sub(lambda m: self._address(m.group(0), "IPV6"), value)
        value = _IPV4.sub(lambda m: self._address(m.group(0), "IPV4"), value)
        return _HOME.sub(lambda m: m.group(0) if _TOKEN.match(m.group(2)) else m.group(1) + self.token(USER, m.group(2)), value)

    def _address(self, text: str, category: str) -> str:
        port = ""
        if category == "IPV6" and not _is_ip(text.split("%", 1)[0]) and text.count(":") >= 3:
            text, port = text.rsplit(":", 1)  # "addr:port"
            port = ":" + port
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return text + port
        if address.is_loopback or address.is_unspecified:
            return text + port
        return self.token(category, text) + port


def _category(key: str | None) -> str | None:
    if not key:
        return None
    key = key.lower()
    if key in _FIELD_CATEGORY:
        return _FIELD_CATEGORY[key]
    if key.endswith(_SERIAL_SUFFIXES):
        return SERIAL
    return None


def _fields(data: Any):
    """(key, value) of every dict entry, at any depth."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield k, v
            yield from _fields(v)
    elif isinstance(data, list):
        for v in data:
            yield from _fields(v)


def _strings(data: Any):
    """Every string in `data`, keys too."""
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for k, v in data.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(data, list):
        for v in data:
            yield from _strings(v)


def _host_of(value: str) -> str:
    """The host in "node-17:5201" or "alice@node-17" (net test's peer, a remote); else `value`."""
    host = value.rsplit("@", 1)[-1]
    if host.count(":") == 1 and host.rsplit(":", 1)[1].isdigit():
        host = host.rsplit(":", 1)[0]
    return host


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return False
