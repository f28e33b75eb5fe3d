"""The kernel log's NVIDIA lines: Xid and SXid events, GPUs fallen off the bus, GPUs the driver
could not start, and PCIe AER reports, each with its time and the PCI bus it names.

Two ways in, one parser: `read_kernel_log` reads this machine's log live (/dev/kmsg, then
`journalctl -k`, then `dmesg`: whichever this user may read, each under a deadline), and
`parse_kernel_log` reads a log captured elsewhere (dmesg, `dmesg -T`, `dmesg -x --time-format
iso`, `journalctl -k`, syslog, /dev/kmsg records). Facts only: which of them is a fault is
decided in judge/gpu_xid.py against the Xid table.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import time
from datetime import datetime, timedelta, timezone

from ..facts import KernelEvent, KernelLog
from ..text_patterns import PCI_SLOT
from . import values as v

KMSG_PATH = "/dev/kmsg"
DMESG_RESTRICT_PATH = "/proc/sys/kernel/dmesg_restrict"
_MAX_BYTES = 64 * 1024 * 1024  # a kernel ring buffer is at most a few MiB; a journal since boot can be more

# -- line prefixes: where the time is, in each form a kernel log is kept in ---------------------
_BUS = rf"{PCI_SLOT}(?:\.[0-7])?"  # Xid lines leave the function out
_PREFIXES = (
    # /dev/kmsg: "6,3964,206764307,-;message" (priority, sequence, microseconds since boot)
    ("kmsg", re.compile(r"^\d+,(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")),
    # dmesg -x / --time-format iso: "kern  :err   : 2025-01-25T10:34:54,859532+00:00 message"
    ("iso", re.compile(r"^(?:\w+\s*:\s*\w+\s*: )?(?P<when>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]?\d*[+-]\d\d:?\d\d)\s+(?P<msg>.*)$")),
    # dmesg: "[74889.644138] message" (optionally after -x's facility:level)
    ("uptime", re.compile(r"^(?:\w+\s*:\s*\w+\s*: )?\[\s*(?P<up>\d+\.\d+)\]\s?(?P<msg>.*)$")),
    # dmesg -T: "[Fri Aug 30 11:43:09 2024] message"
    ("ctime", re.compile(r"^\[(?P<when>\w{3} \w{3} +\d{1,2} \d\d:\d\d:\d\d \d{4})\]\s?(?P<msg>.*)$")),
    # dmesg -H / -e (--reltime): "[Dec 3 10:01] message" when the minute changes, then "[  +0.000844] message"
    # (seconds after the line before); strftime's "%b%e" runs the month into a two-digit day ("Dec13")
    ("reltime", re.compile(r"^\[(?P<when>[A-Z][a-z]{2} ?\d{1,2} \d\d:\d\d)\]\s?(?P<msg>.*)$")),
    ("delta", re.compile(r"^\[\s*[+<]\s*(?P<delta>\d{1,9}\.\d+)>?\]\s?(?P<msg>.*)$")),
    # talosctl dmesg: "192.168.11.119: kern: warning: [2026-04-22T21:30:51.52643656Z]: message"
    ("talos", re.compile(r"^(?:\S+: )?\w+:\s*\w+: \[(?P<when>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d))\]: (?P<msg>.*)$")),
    # journalctl -k -o short-iso, syslog with ISO times: "2025-02-14T05:03:41+0000 host kernel: message"
    ("journal-iso", re.compile(r"^(?P<when>\d{4}-\d\d-\d\dT\S+) \S+ kernel: (?:\[\s*(?P<up>\d+\.\d+)\] )?(?P<msg>.*)$")),
    # journalctl -k, /var/log/syslog, kern.log: "Feb 09 15:47:06 debian kernel: [  885.2] message"
    ("syslog", re.compile(r"^(?P<when>\S{3,4}\.? +\d{1,2} \d\d:\d\d:\d\d) \S+ kernel: (?:\[\s*(?P<up>\d+\.\d+)\] )?(?P<msg>.*)$")),
)

# -- the messages -------------------------------------------------------------------------------
_XID = re.compile(rf"NVRM: Xid \(PCI:(?P<bus>{_BUS})\): (?P<code>\d+),\s*(?P<rest>.*)")
_SXID = re.compile(rf"SXid \(PCI:(?P<bus>{_BUS})\): (?P<code>\d+),\s*(?P<rest>.*)")
_FALLEN = re.compile(rf"(?:GPU at (?:PCI:)?(?P<bus1>{_BUS}) has fallen off the bus|NVRM: GPU (?P<bus2>{_BUS}): GPU has fallen off the bus)")
# Newer drivers say it over three lines: "NVRM: The NVIDIA GPU 0000:b3:00.0" / "(PCI ID: ...) installed
# in this system has" / "fallen off the bus and is not responding to commands."
_FALLEN_START = re.compile(rf"NVRM: The NVIDIA GPU (?P<bus>{_BUS})\s*$")
# The driver asking for a reset without an Xid of its own: "Reset required [NV_ERR_RESET_REQUIRED]" from
# an RM call, "GPU marked for reset" after GSP timeouts; the GPU refuses new work until it is reset.
_RESET_REQUIRED = re.compile(r"NVRM: .*(?:\[NV_ERR_RESET_REQUIRED\]|GPU marked for reset|GPU reset required)", re.I)
_ANY_BUS = re.compile(rf"(?:PCI:|GPU )(?P<bus>{_BUS})")
_INIT_FAILED = re.compile(rf"NVRM: GPU (?P<bus>{_BUS}): RmInitAdapter failed!?\s*(?P<rest>.*)")
_AER = re.compile(rf"^\S+ (?P<bus>{_BUS}): (?:AER: )?PCIe Bus Error: severity=(?P<severity>[^,]+)")
_GPU_AT = re.compile(rf"NVRM: GPU at PCI:(?P<bus>{_BUS}): GPU-")
_NVIDIA_DEVICE = re.compile(rf"^nvidia (?P<bus>{_BUS}): ")
# The kernel tells the drivers below a port about its AER error: "nvidia 0000:02:00.0: device has no
# AER-aware driver" names the GPU behind the root port that logged it.
_AER_BELOW = re.compile(rf"^nvidia (?P<bus>{_BUS}): (?:AER|.*AER-aware|.*error_detected)")
_PROCESS = re.compile(r"name=(?P<name>[^,\s]+)")
_NVRM_ANYWHERE = re.compile(r"NVRM:|SXid \(PCI:|nvidia-nvswitch|PCIe Bus Error")
# Lines a kernel log starts with at boot (dmesg's ring buffer has not wrapped when one is there).
_BOOT_LINE = re.compile(r"^Linux version \d")


def normal_bus(raw: str) -> str | None:
    """ "0000:02:00" (Xid lines leave the function out) and "00000000:1a:00.0" -> "0000:02:00.0"."""
    return v.bus_id(raw if "." in raw else f"{raw}.0")


def looks_like_kernel_log(text: str) -> bool:
    """A kernel log captured with dmesg, journalctl, syslog or /dev/kmsg: most of its first lines
    carry one of the kernel log's time prefixes, or it holds the NVIDIA driver's own lines."""
    lines = [line for line in text.splitlines()[:60] if line.strip()]
    if not lines:
        return False
    prefixed = sum(1 for line in lines if _split(line.strip())[0] is not None)
    return prefixed * 2 >= len(lines) or any(_NVRM_ANYWHERE.search(line) for line in lines)


def _split(line: str) -> tuple[str | None, str | None, float | None, str]:
    """(form, time as printed, seconds since boot, message) of one log line; form None: no prefix."""
    for form, pattern in _PREFIXES:
        m = pattern.match(line)
        if not m:
            continue
        groups = m.groupdict()
        if form == "kmsg":
            usec = bounded_int(groups["usec"], digits=18)
            since_boot = usec / 1e6 if usec is not None else None
            return form, f"[{since_boot:.6f}]" if since_boot is not None else None, since_boot, groups["msg"]
        if form == "delta":
            return form, f"[+{groups['delta']}]", None, groups["msg"]
        up = float(groups["up"]) if groups.get("up") else None
        when = groups.get("when") or (f"[{groups['up']}]" if groups.get("up") else None)
        return form, when, up, groups["msg"]
    return None, None, None, line


_MAX_CODE_DIGITS = 9  # no Xid or SXid code is longer; a line with more is damaged or hostile


def bounded_int(text: str, digits: int = _MAX_CODE_DIGITS) -> int | None:
    """The number `text` spells, or None past `digits` digits: int() of thousands of digits raises
    ("Exceeds the limit (4300 digits)") or takes quadratic time, and no real log holds one."""
    return int(text) if text.isdigit() and len(text) <= digits else None


_YEARLESS = 2000  # syslog's "Feb 09 15:47:06" has no year: a leap year, so Feb 29 parses; set right below


def _dated(form: str | None, when: str | None) -> datetime | None:
    """The line's own date and time: aware where the line gives its zone (iso, journalctl -o
    short-iso), naive where it does not (dmesg -T, syslog: the machine's local time)."""
    if when is None or form in (None, "kmsg", "uptime", "delta"):
        return None
    try:
        if form in ("iso", "journal-iso", "talos"):
            text = re.sub(r"([+-]\d\d)(\d\d)$", r"\1:\2", when.replace(",", "."))
            text = re.sub(r"(\.\d{6})\d+", r"\1", text)  # talos prints nanoseconds; Python 3.10 reads up to 6 digits
            return datetime.fromisoformat(text.replace("Z", "+00:00"))
        if form == "reltime":  # "Dec 3 10:01", "Dec13 10:01": no year, no seconds
            month_day = re.sub(r"^([A-Za-z]{3}) ?(\d)", r"\1 \2", when)
            return datetime.strptime(f"{_YEARLESS} {month_day}", "%Y %b %d %H:%M")
        if form == "ctime":
            return datetime.strptime(" ".join(when.split()), "%a %b %d %H:%M:%S %Y")
        if form == "syslog":
            return datetime.strptime(f"{_YEARLESS} " + " ".join(when.rstrip(".").split()), "%Y %b %d %H:%M:%S")
    except ValueError:
        return None
    return None


def parse_kernel_log(text: str, source: str, boot_at: datetime | None = None) -> KernelLog:
    """Every NVIDIA-related event in `text`, with the span of time the text covers. `boot_at`
    (aware): when this machine booted, to date lines that carry only seconds since boot (read
    live; a capture's boot time is not known)."""
    reader = _Reader(KernelLog(source=source, read=True), boot_at)
    for number, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if not line or (raw[:1] == " " and "=" in line.split(" ", 1)[0] and not line.startswith("NVRM")):
            continue  # /dev/kmsg continuation records (" SUBSYSTEM=pci")
        reader.read(number, line)
    return reader.finish()


class _Reader:
    """parse_kernel_log's state, one step per concern: a line's time, its own event, the GPU an AER
    report of the port above it names, a fallen-off-the-bus message spread over lines, the GPUs seen."""

    def __init__(self, log: KernelLog, boot_at: datetime | None):
        self.log, self.boot_at = log, boot_at
        self.last_dated: datetime | None = None
        self.pending_fallen: tuple[str, str | None, float | None, int] | None = None  # bus, when, uptime, line number
        self.last_aer: tuple[KernelEvent, int] | None = None  # the latest port AER error, and its line number
        self.buses: dict[str, None] = {}
        self.first_uptime: float | None = None
        self.minute: tuple[datetime | None, float] = (None, 0.0)  # dmesg -H: the last "[Dec 3 10:01]" and the seconds after it

    def read(self, number: int, line: str) -> None:
        form, when, uptime, msg = _split(line)
        msg = msg.strip()
        self.log.lines += 1
        at = self._time_of(form, when, uptime, msg)
        count = len(self.log.events)
        event = _event(msg, when, uptime)
        if event is not None:
            self.log.events.append(event)
            if event.kind == "aer":
                self.last_aer = (event, number)
        self._gpu_below_port(number, msg)
        self._fallen_off_bus(number, msg, when, uptime)
        for pattern in (_GPU_AT, _NVIDIA_DEVICE):
            m = pattern.search(msg)
            if m and (named := normal_bus(m.group("bus"))):
                self.buses[named] = None
        for added in self.log.events[count:]:  # this line's events (a multi-line one: a line or three before)
            added.at = at
            added.line_number = added.line_number or number + 1

    def _time_of(self, form: str | None, when: str | None, uptime: float | None, msg: str) -> str | None:
        """The line's time as ISO 8601 where it can be dated; keeps the log's span and boot marks."""
        log = self.log
        if when is not None and form != "delta":
            log.first = log.first or when
            log.last = when
        if uptime is not None and self.first_uptime is None:
            self.first_uptime = uptime
        if _BOOT_LINE.match(msg):
            log.since_boot = True
        dated = _dated(form, when)
        if form == "reltime":
            self.minute = (dated, 0.0)
        elif form == "delta" and when is not None:
            self.minute = (self.minute[0], self.minute[1] + float(when[2:-1]))
            dated = self.minute[0] + timedelta(seconds=self.minute[1]) if self.minute[0] is not None else None
        if uptime is not None and self.boot_at is not None and (dated is None or dated.tzinfo is None):
            dated = _after_boot(self.boot_at, uptime)  # live: boot time + seconds since boot beats a zone-less date
        self.last_dated = dated or self.last_dated
        return dated.isoformat(timespec="seconds") if dated else None

    def _gpu_below_port(self, number: int, msg: str) -> None:
        """An AER report of a root or switch port names the GPU below it a few lines on: count the
        port's error against that GPU too."""
        below = _AER_BELOW.search(msg)
        if not below or self.last_aer is None or number - self.last_aer[1] > 8:
            return
        port_event, _ = self.last_aer
        gpu_bus = normal_bus(below.group("bus"))
        if gpu_bus and gpu_bus != port_event.bus_id:
            self.log.events.append(KernelEvent("aer", gpu_bus, None, port_event.severity, None, port_event.when,
                                               port_event.uptime_s, f"{port_event.line} (the port above {gpu_bus})"))
        self.last_aer = None

    def _fallen_off_bus(self, number: int, msg: str, when: str | None, uptime: float | None) -> None:
        """"The NVIDIA GPU at PCI:... has fallen off the bus" spread over up to three lines."""
        if self.pending_fallen is not None:
            if "fallen off the bus" in msg:
                bus, p_when, p_up, start_line = self.pending_fallen
                self.log.events.append(KernelEvent("fallen_off_bus", bus, 79, "fatal", None, p_when, p_up,
                                                   "NVRM: The NVIDIA GPU ... has fallen off the bus and is not responding to commands",
                                                   line_number=start_line + 1))
                self.pending_fallen = None
            elif number - self.pending_fallen[3] > 3:
                self.pending_fallen = None
        start = _FALLEN_START.search(msg)
        if start and (fallen_bus := normal_bus(start.group("bus"))):
            self.pending_fallen = (fallen_bus, when, uptime, number)

    def finish(self) -> KernelLog:
        log = self.log
        if self.last_dated is not None:
            _mend_years(log.events, self.last_dated)
            log.now, log.now_is = self.last_dated.isoformat(timespec="seconds"), "last line"
        if log.since_boot is None and self.first_uptime is not None:
            log.since_boot = self.first_uptime < 10.0  # dmesg's first line a few seconds after boot: not wrapped
        log.gpu_buses = list(self.buses)
        return log


def _after_boot(boot_at: datetime, uptime: float) -> datetime | None:
    try:
        return boot_at + timedelta(seconds=uptime)
    except (OverflowError, ValueError):  # a damaged record's "seconds since boot" past year 9999
        return None


def _mend_years(events: list[KernelEvent], last: datetime) -> None:
    """Year-less syslog dates take the last line's year, and the year before for dates after it
    (a log that crossed New Year)."""
    if last.year != _YEARLESS or last.tzinfo is not None:
        return
    for event in events:
        if event.at is None:
            continue
        dated = datetime.fromisoformat(event.at)
        if dated.year == _YEARLESS and dated > last + timedelta(days=1):
            year_before = dated.replace(day=28) if (dated.month, dated.day) == (2, 29) else dated
            event.at = year_before.replace(year=_YEARLESS - 1).isoformat(timespec="seconds")


def _event(msg: str, when: str | None, uptime: float | None) -> KernelEvent | None:
    m = _XID.search(msg)
    if m:
        rest = m.group("rest")
        process = _PROCESS.search(rest)
        name = process.group("name").strip("'\"") if process else None
        return KernelEvent("xid", normal_bus(m.group("bus")), bounded_int(m.group("code")), _severity_word(rest),
                           None if name in (None, "<unknown>") else name, when, uptime, msg)
    m = _SXID.search(msg)
    if m:
        return KernelEvent("sxid", normal_bus(m.group("bus")), bounded_int(m.group("code")), _severity_word(m.group("rest")),
                           None, when, uptime, msg)
    m = _FALLEN.search(msg)
    if m:
        return KernelEvent("fallen_off_bus", normal_bus(m.group("bus1") or m.group("bus2")), 79, "fatal", None, when, uptime, msg)
    m = _INIT_FAILED.search(msg)
    if m:
        return KernelEvent("init_failed", normal_bus(m.group("bus")), None, "fatal", None, when, uptime, msg)
    if _RESET_REQUIRED.search(msg):
        m = _ANY_BUS.search(msg)
        return KernelEvent("reset_required", normal_bus(m.group("bus")) if m else None, None, "fatal", None, when, uptime, msg)
    m = _AER.search(msg)
    if m:
        return KernelEvent("aer", normal_bus(m.group("bus")), None, _aer_severity(m.group("severity")), None, when, uptime, msg)
    return None


def _aer_severity(printed: str) -> str:
    """ "Corrected", "Uncorrected (Non-Fatal)", "Uncorrected (Fatal)" -> corrected, uncorrected, uncorrected_fatal."""
    word = printed.strip().lower()
    if word.startswith("correct"):
        return "corrected"
    return "uncorrected_fatal" if "fatal" in word and "non" not in word else "uncorrected"


def _severity_word(rest: str) -> str | None:
    """NVLink Xids (144-150) and SXids say themselves whether they are fatal."""
    lowered = rest.lower()
    if re.search(r"\bnon-?fatal\b", lowered):
        return "nonfatal"
    if re.search(r"\bfatal\b", lowered):
        return "fatal"
    return None


# -- live ---------------------------------------------------------------------------------------

def clocks() -> tuple[datetime, datetime]:
    """(now, when this machine booted), both UTC. The kernel stamps its lines with seconds since
    boot; boot = now - CLOCK_BOOTTIME, as `dmesg -T` reckons it (off by the time spent suspended,
    which a server does not)."""
    now = time.time()
    since_boot = time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))
    return datetime.fromtimestamp(now, timezone.utc), datetime.fromtimestamp(now - since_boot, timezone.utc)


def read_kernel_log(deadline_s: float = 5.0, kmsg_path: str | None = None,
                    now_and_boot: tuple[datetime, datetime] | None = None) -> KernelLog:
    """This machine's kernel log since boot, from the first of /dev/kmsg, `journalctl -k -b` and
    `dmesg` this user may read, all within `deadline_s`. When none can be read, the KernelLog says
    why for each (`why_unread`): kernel.dmesg_restrict, a container without the host's log, no
    permission on the journal, a command that hung. Each event is dated (`at`): seconds since boot
    plus the boot time of `now_and_boot` (default: this machine's clocks)."""
    end = time.monotonic() + deadline_s
    now, boot = now_and_boot or clocks()
    reasons: list[str] = []
    readers = ((kmsg_path or KMSG_PATH, _read_kmsg), ("journalctl -k", _read_journal), ("dmesg", _read_dmesg))
    for name, reader in readers:
        left = end - time.monotonic()
        if left <= 0:
            reasons.append(f"{name}: not tried, the {deadline_s:g} s deadline had passed")
            continue
        text, why = reader(name, left)
        if text is not None:
            log = parse_kernel_log(text, name, boot_at=boot)
            log.now, log.now_is = now.isoformat(timespec="seconds"), "read"
            if name == "journalctl -k":
                log.since_boot = True  # -b: the journal keeps the whole boot
            if reasons:
                log.why_unread = "; ".join(reasons)  # kept: why the earlier sources were passed over
            return log
        reasons.append(f"{name}: {why}")
    return KernelLog(source=None, read=False, why_unread="; ".join(reasons))


def _read_kmsg(path: str, deadline_s: float) -> tuple[str | None, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, "not present (a container without the host's kernel log?)"
    except PermissionError:
        return None, f"permission denied{_restrict_note()}"
    except OSError as err:
        return None, err.strerror or str(err)
    chunks: list[bytes] = []
    size, end = 0, time.monotonic() + deadline_s
    try:
        while size < _MAX_BYTES and time.monotonic() < end:
            try:
                chunk = os.read(fd, 8192)  # one record per read on /dev/kmsg
            except BlockingIOError:
                break  # EAGAIN: every record so far has been read
            except OSError as err:
                if err.errno == errno.EPIPE:
                    continue  # a record overwritten while reading: the next read gets the next one
                if err.errno in (errno.EPERM, errno.EACCES):
                    return None, f"permission denied{_restrict_note()}"
                return None, err.strerror or str(err)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    return (text, "") if text.strip() else (None, "read, but empty")


def _restrict_note() -> str:
    try:
        with open(DMESG_RESTRICT_PATH, encoding="ascii") as f:
            restricted = f.read().strip() == "1"
    except OSError:
        return ""
    return " (kernel.dmesg_restrict=1: only root or CAP_SYSLOG may read the kernel log)" if restricted else ""


def _run(argv: list[str], deadline_s: float) -> tuple[str | None, str]:
    if shutil.which(argv[0]) is None:
        return None, "not installed"
    try:
        done = subprocess.run(argv, capture_output=True, timeout=max(deadline_s, 0.1), check=False)
    except subprocess.TimeoutExpired:
        return None, f"gave no answer within {deadline_s:.1f} s"
    except OSError as err:
        return None, err.strerror or str(err)
    out = done.stdout[:_MAX_BYTES].decode("utf-8", errors="replace")
    err_text = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
    if done.returncode != 0:
        detail = err_text[0] if err_text else f"exit status {done.returncode}"
        if "not permitted" in detail.lower() or "permission" in detail.lower():
            detail += _restrict_note()
        return None, detail
    return out, ""


def _read_journal(name: str, deadline_s: float) -> tuple[str | None, str]:
    text, why = _run(["journalctl", "-k", "-b", "--no-pager", "-q", "-o", "short-iso"], deadline_s)
    if text is None:
        return None, why
    if not any(" kernel: " in line for line in text.splitlines()[:200]):
        return None, "no kernel lines (no journal kept here, or this user is not in the adm or systemd-journal group)"
    return text, ""


def _read_dmesg(name: str, deadline_s: float) -> tuple[str | None, str]:
    text, why = _run(["dmesg"], deadline_s)
    if text is None:
        return None, why
    return (text, "") if text.strip() else (None, "printed nothing")
