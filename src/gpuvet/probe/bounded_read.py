"""Reading a capture with a bound on its size and on the time it may take to arrive.

A capture is small: `nvidia-smi -q -x` of an 8-GPU node is about 200 KB, a whole capture bundle a
few MB. Anything far larger (`/dev/zero`, a 200 MB XML of 18,860 "GPUs") is not a capture of a
machine, and reading it whole would eat the memory and minutes of the person who only wanted a
verdict; a FIFO whose writer never comes would wait for ever. Both are refused in one line.
"""

from __future__ import annotations

import os
import select
import stat
import time

from .errors import CaptureError

MAX_CAPTURE_BYTES = 32 * 1024 * 1024  # about 150 times the -q -x of an 8-GPU node
# The most GPUs one capture may list, and the highest GPU index it may name: nvidia-smi numbers
# the GPUs of one machine from 0, and the largest machines hold tens of them (NVL72 racks are
# many machines). A higher count or index is a damaged or made-up file; it would size work.
MAX_GPUS = 1024
# `ssh host nvidia-smi -q -x | gpuvet inspect -` arrives well within this. It is the command's
# budget, counted from the process's start: the import before the first read (1.6 s on a loaded
# machine) and earlier files of the same command come out of it, so a FIFO whose writer never
# comes is refused by the 60 s the README promises, not 61.6.
READ_SECONDS = 60.0
_CHUNK = 1 << 20


def read_bounded(path: str, fd: int | None = None) -> bytes:
    """The bytes of the file at `path` (or of the open descriptor `fd`, e.g. stdin), at most
    MAX_CAPTURE_BYTES of them, arriving within READ_SECONDS; CaptureError otherwise."""
    own = fd is None
    if fd is None:
        fd = _open(path)
    try:
        return _read_all(fd, path, _seconds_left(), MAX_CAPTURE_BYTES)
    finally:
        if own:
            os.close(fd)


def _open(path: str) -> int:
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise CaptureError(f"{path}: is a directory; give the capture files themselves")
        # Non-blocking so that opening a FIFO without a writer returns; the reads then wait on select.
        return os.open(path, os.O_RDONLY | (os.O_NONBLOCK if stat.S_ISFIFO(mode) else 0))
    except OSError as err:
        raise CaptureError(f"{path}: cannot read it ({err.strerror or err})") from None


_command_started: float | None = None  # time.monotonic() when the command began (start_command)


def start_command(age: float = 0.0) -> None:
    """The command began `age` seconds ago: every read after this shares READ_SECONDS from then."""
    global _command_started
    _command_started = time.monotonic() - age


def end_command() -> None:
    """The command is over: reads after it (a library, a test calling main() in-process) each get
    the whole window again, not what was left of a command that ended minutes ago."""
    global _command_started
    _command_started = None


def _seconds_left() -> float:
    if _command_started is None:  # used as a library: each read gets the whole window
        return READ_SECONDS
    return READ_SECONDS - (time.monotonic() - _command_started)


def process_age() -> float:
    """Seconds since this process started (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            started_ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _read_all(fd: int, path: str, seconds: float, limit: int) -> bytes:
    if os.isatty(fd):
        seconds = float("inf")  # someone pasting into a terminal ends with Ctrl-D, or Ctrl-C
    deadline = time.monotonic() + max(0.0, seconds)
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], None if left == float("inf") else left)[0]:
            raise CaptureError(f"{path}: nothing more arrived within {READ_SECONDS:.0f} s of the command's start "
                               f"({size} bytes read); "
                               "give a finished capture file (a FIFO or pipe whose writer never ends is not one)")
        try:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
        except BlockingIOError:
            continue
        except OSError as err:
            raise CaptureError(f"{path}: cannot read it ({err.strerror or err})") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        check_size(size, path, limit)


def check_size(size: int, path: str, limit: int = MAX_CAPTURE_BYTES) -> None:
    if size > limit:
        raise CaptureError(f"{path}: larger than {limit // (1024 * 1024)} MB, far more than any nvidia-smi "
                           "capture of one machine; give the capture itself (not a device, a log or an archive)")


def check_gpu_count(count: int, what: str) -> None:
    """Refuse a capture that lists more GPUs than any one machine holds."""
    if count > MAX_GPUS:
        raise CaptureError(f"{what} lists {count} GPUs, more than the {MAX_GPUS} any one machine holds: "
                           "a damaged or generated file, not a capture")


def check_gpu_index(index: int | None, what: str) -> None:
    """Refuse a GPU index no machine has: indices number a machine's GPUs from 0. None is a number
    too long to be one (values.whole: 600 digits of "GPU 1111..." in a damaged capture)."""
    if index is None or not 0 <= index < MAX_GPUS:
        shown = "with a number too long to read" if index is None else str(index)
        raise CaptureError(f"{what} names GPU {shown}; a machine's GPUs are numbered 0 to at most "
                           f"{MAX_GPUS - 1}: a damaged or edited capture")
