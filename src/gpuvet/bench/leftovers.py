"""Nothing a benchmark creates outlives it: scratch folders and files, servers, worker processes.

Ctrl-C, SIGTERM (timeout, systemd, a dropped SSH session) and kill -9 each end a run at a moment
of their choosing. So:
- cleanup runs with SIGINT and SIGTERM held back (`signals_deferred`): a second Ctrl-C while
  4,000 small files are being removed does not leave half of them;
- scratch folders and files carry the creating process's id and a digest of the host name
  (`.gpuvet-disk-1234@1a2b3c4d-XXXX`), so the next run removes those of a process that is gone
  (`sweep_stale`): kill -9 leaves them, and nothing else ever does. Only gpuvet's own names, only
  this host's (a shared file system may hold another node's live run), only of a pid that no
  longer exists, only files this user owns;
- a process that gets SIGTERM removes what it registered before it exits (`remove_registered`);
- a server gpuvet starts dies with gpuvet (`die_with_parent`, Linux's PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from typing import Callable, Iterator

_HELD = {signal.SIGINT, signal.SIGTERM}
_registered: set[str] = set()
_lock = threading.Lock()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends (then arrive as usual). Only the main
    thread runs Python's signal handlers, so elsewhere nothing needs holding back. The handlers
    are swapped for ones that note the signal, rather than the signals masked: a process-directed
    signal goes to any thread that does not mask it (the telemetry sampler's, the host benchmarks'),
    and Python would still raise it in the main thread, in the middle of the cleanup."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def note(signum: int, frame: object) -> None:
        arrived.append(signum)

    previous = {}
    for signum in _HELD:
        with contextlib.suppress(ValueError, OSError):
            previous[signum] = signal.signal(signum, note)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        for number in dict.fromkeys(arrived):
            signal.raise_signal(number)  # now handled as it would have been


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def owned_prefix(prefix: str) -> str:
    """`prefix` + this process's id and host: what sweep_stale recognises."""
    return f"{prefix}{os.getpid()}@{_host_tag()}-"


@contextlib.contextmanager
def scratch_dir(prefix: str, parent: str | None = None) -> Iterator[str]:
    """A private folder in `parent` (default: the temp folder) removed at the end, whatever
    ends the block; a dead run's folders of the same prefix go first."""
    parent = parent or tempfile.gettempdir()
    sweep_stale(prefix, parent)
    path = tempfile.mkdtemp(prefix=owned_prefix(prefix), dir=parent)
    register(path)
    try:
        yield path
    finally:
        remove(path)


TEMP_DIR_PREFIX = "gpuvet-tmp-"


def own_temp_dir() -> str:
    """Make one folder, owned by this run, the temp folder of gpuvet and of every process it starts
    (tempfile.tempdir, TMPDIR): multiprocessing's pymp-* folders, a worker's scratch, a library's
    temp files all go inside it. It is removed at exit; a run killed with -9 leaves it, and the next
    gpuvet run on this host removes it (sweep_stale) before making its own. SIGKILL used to leave a
    pymp-* folder in /tmp every time, which nothing ever removed."""
    parent = tempfile.gettempdir()
    sweep_stale(TEMP_DIR_PREFIX, parent)
    path = tempfile.mkdtemp(prefix=owned_prefix(TEMP_DIR_PREFIX), dir=parent)
    register(path)
    atexit.register(remove, path)
    tempfile.tempdir = path
    os.environ["TMPDIR"] = path
    return path


def register(path: str) -> None:
    """Remove `path` (file or folder) if this process is ended by SIGTERM before it does."""
    with _lock:
        _registered.add(path)


def remove(path: str) -> None:
    """Remove `path` now (with Ctrl-C held back) and forget it."""
    with signals_deferred():
        _remove_path(path)
        with _lock:
            _registered.discard(path)


def remove_registered() -> None:
    """What a SIGTERM handler calls before the process exits."""
    with _lock:
        paths = list(_registered)
        _registered.clear()
    for path in paths:
        _remove_path(path)


def _remove_path(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def sweep_stale(prefix: str, parent: str) -> list[str]:
    """Remove what a dead gpuvet run of this host left in `parent` under `prefix`; the paths removed."""
    owned = re.compile(re.escape(prefix) + r"(\d+)@" + re.escape(_host_tag()) + r"-")
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = owned.match(entry.name)
        if not match or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            remove(entry.path)
            removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process (or a pid too large to ask about): leave it alone
    return True


def exit_on_sigterm(code: int = 143) -> None:
    """For a child process (the benchmark worker): SIGTERM removes the registered scratch, then
    exits at once. Its benchmarks run in threads, so an exception in the main thread would
    not reach their `finally` blocks; this does their cleanup for them."""
    def handler(signum: int, frame: object) -> None:
        remove_registered()
        os._exit(code)

    signal.signal(signal.SIGTERM, handler)


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes a child (iperf3 -s) get SIGTERM when gpuvet dies, kill -9
    included; None where Linux's prctl is not there. libc is looked up here, before the fork."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
