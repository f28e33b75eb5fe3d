"""Disk benchmark (B6): what the storage under a directory does, not what the page cache does.

For every path: `disk.seq_write` and `disk.seq_read` (MB/s, 10^6 bytes/s, 1 MiB blocks, 8 in
flight), `disk.rand_read_iops` (4 KiB random reads, 32 in flight: the depth drive makers quote;
p50/p99 latency in details) and `disk.small_files` (4,000 16 KiB files written, fewer where the
disk creates them too slowly for the budget, then read back cold in shuffled order by 4 readers, like a DataLoader over a folder of small images; p50/p99 of
one file's open-read-close).

Engines: fio when it is installed ("auto" or "fio": libaio, --direct=1, JSON output), gpuvet's
own otherwise ("builtin": Linux native AIO through ctypes, the mechanism of fio's libaio engine,
on page-aligned buffers; threads doing pwrite/preadv where AIO cannot work; `details.io` says
which). Both run the same jobs (block size, depth, file, offsets drawn the same way) and keep
the queue full the same way, fio's default: each request submitted on its own the moment one
completes (`details.method`), so they measure the same thing; the small-files test is always
built-in, since fio has no per-file open/read/close pattern.
`details.engine` says which engine measured; with "auto", a fio failure hands over to the
built-in engine and `details.fallback_reason` says why.

The page cache is kept out two ways, and `details.cache` says which applied:
- "O_DIRECT": reads and writes bypass it (most local file systems, NFS);
- "fsync+fadvise": where the file system refuses O_DIRECT, writes are timed up to the end of an
  fsync, and reads start after posix_fadvise(DONTNEED) has dropped the file's pages.
The seed's `dd ... conv=fdatasync` measures the page cache plus one flush instead.

Safety: at most 10% of the free space and 1 GiB is written, in a private temporary directory
that is removed afterwards, also on error or Ctrl-C. A missing, read-only or full directory is
a `bench.disk` note (skipped, with the reason), never an exception.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import itertools
import json
import mmap
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..facts import Storage
from ..probe.host import storage_for
from .common import measurement
from .leftovers import owned_prefix, register, remove, sweep_stale
from ..samples import quantile

KIB, MIB, GIB = 1024, 1024**2, 1024**3
SEQ_BLOCK = 1 * MIB
SEQ_DEPTH = 8
RAND_BLOCK = 4 * KIB
RAND_DEPTH = 32
RAND_SECONDS = 3.0  # long enough for stable IOPS and a p99 from tens of thousands of reads

MAX_TEST_BYTES = 1 * GIB
FREE_SHARE = 0.10  # never write more than this share of the free space
MIN_TEST_BYTES = 32 * MIB
SMALL_FILE_BYTES = 16 * KIB
SMALL_FILES_MAX = 4096
# "Thousands of files": creating them is set-up, not the measurement, so it may run past its half
# of the pass to reach this many (where the space allows), into the time the reads do not need.
SMALL_FILES_MIN = 4000
SMALL_READ_MIN_S = 1.0  # cold reads are timed for at least this long (rounds, the cache dropped before each)
SMALL_FILE_READERS = 4
FILES_PER_DIR = 512
TEMP_PREFIX = ".gpuvet-disk-"
# Each pass's part of what is left of a path's budget when it starts; the rest (SPARE_PART) covers
# fio's start-up and final fsync. A fast disk finishes each pass well before its part.
PHASE_SHARE = {"seq_write": 0.25, "seq_read": 0.25, "rand_read": 0.15, "small_files": 0.25}
SPARE_PART = 0.10
MIN_PHASE_S = 0.5
CLEANUP_RESERVE_S = 1.0  # removing the 1 GiB file and 4,000 small ones (1.1 s on a slow VM disk)
FIO_SLACK_S = 30.0  # fio start-up, file layout and the final fsync on a slow disk

ENGINES = ("auto", "fio", "builtin")

Progress = Callable[[str], None]


class EngineError(Exception):
    """An engine could not measure (fio failed, an IO error...); the message says why."""


@dataclass
class Target:
    """One tested directory and the test file both engines use."""

    path: str  # as the user gave it: the measurements' subject
    workdir: str  # our private temporary directory inside it
    file: str
    size: int  # most bytes the sequential write may write
    small_files: int
    direct: bool  # O_DIRECT works here
    storage: Storage

    @property
    def cache(self) -> str:
        return "O_DIRECT" if self.direct else "fsync+fadvise"


@dataclass
class Pass:
    """What one measured pass did."""

    bytes: int
    seconds: float
    ops: int = 0
    p50_us: float | None = None
    p99_us: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mb_s(self) -> float:
        return self.bytes / self.seconds / 1e6

    @property
    def iops(self) -> float:
        return self.ops / self.seconds


# -- entry point ------------------------------------------------------------------------------

def run(paths: list[str], engine: str = "auto", budget_s: float = 20.0,
        progress: Progress = lambda m: None, max_bytes: int = MAX_TEST_BYTES) -> list[dict]:
    """Measure each directory in `paths` within its share of `budget_s` seconds, writing at most
    `max_bytes` (and 10% of the free space) in each."""
    engine = "fio" if engine == "iperf3" else engine  # one --engine flag drives disk and net
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    fio = find_fio()
    if engine == "fio" and fio is None:
        return [note(p, "skipped", "fio is not installed (`apt-get install fio`); or use --engine builtin")
                for p in paths]
    chosen = "fio" if fio and engine in ("auto", "fio") else "builtin"
    share = budget_s / max(1, len(paths))
    results: list[dict] = []
    for path in paths:
        results += _run_path(path, chosen, fio, engine == "auto", share, progress, max_bytes)
    return results


def find_fio() -> str | None:
    """fio on PATH (tests hide it by changing PATH)."""
    return shutil.which("fio")


def note(path: str, outcome: str, reason: str) -> dict:
    """A `bench.disk` entry for a path that was not (fully) measured."""
    return measurement("bench.disk", None, "", path, outcome=outcome, reason=reason)


def _run_path(path: str, chosen: str, fio: str | None, fallback: bool, seconds: float,
              progress: Progress, max_bytes: int) -> list[dict]:
    clock = PathClock(seconds)  # from the start: sweeping a killed run's files counts too
    reason = _unusable(path)
    if reason:
        return [note(path, "skipped", reason)]
    free = free_bytes(path)
    size = allowed_bytes(free, max_bytes)
    if size is None:
        return [note(path, "skipped", f"only {free / MIB:.0f} MiB free: the disk test needs "
                                      f"{MIN_TEST_BYTES / FREE_SHARE / MIB:.0f} MiB free, since it writes at most "
                                      f"{FREE_SHARE:.0%} of the free space and no less than {MIN_TEST_BYTES // MIB} MiB")]
    sweep_stale(TEMP_PREFIX, path)  # a killed run's folder (its 1 GiB file, 4,000 small ones)
    try:
        workdir = tempfile.mkdtemp(prefix=owned_prefix(TEMP_PREFIX), dir=path)
    except OSError as err:
        return [note(path, "skipped", _not_writable(err, path))]
    register(workdir)
    results: list[dict] = []
    try:
        target = _target(path, workdir, size)
        engines = _engines(chosen, fio, fallback)
        _measure(target, engines, clock, progress, results)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:  # noqa: BLE001 - an IO error on one path must not end the run
        results.append(note(path, "failed", f"{type(err).__name__}: {err}"))
    finally:
        remove(workdir)  # with Ctrl-C held back: a second one must not leave half the files
    return results


def _unusable(path: str) -> str | None:
    if not os.path.exists(path):
        return f"{path} does not exist"
    if not os.path.isdir(path):
        return f"{path} is not a directory"
    if not sys.platform.startswith("linux"):  # no O_DIRECT and no fadvise: the page cache would answer
        return "the disk benchmark needs Linux (O_DIRECT or posix_fadvise keep the page cache out)"
    return None


def _not_writable(err: OSError, path: str) -> str:
    """Why `path` (the user's directory, not our temporary one inside it) cannot take test files."""
    if err.errno == errno.EROFS:
        return f"read-only file system: {path}"
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"no permission to write in {path}"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left (or quota exceeded) in {path}"
    return f"cannot write in {path}: {err.strerror}"


def free_bytes(path: str) -> int:
    return shutil.disk_usage(path).free


def allowed_bytes(free: int, max_bytes: int = MAX_TEST_BYTES) -> int | None:
    """Bytes the test may write: 10% of the free space, at most `max_bytes`, whole MiB; None: too full."""
    size = min(max_bytes, int(free * FREE_SHARE)) // MIB * MIB
    return size if size >= MIN_TEST_BYTES else None


def _target(path: str, workdir: str, size: int) -> Target:
    small = min(SMALL_FILES_MAX, size // 4 // SMALL_FILE_BYTES)  # a quarter of the allowance
    return Target(path=path, workdir=workdir, file=os.path.join(workdir, "seq.bin"),
                  size=(size - small * SMALL_FILE_BYTES) // SEQ_BLOCK * SEQ_BLOCK, small_files=small,
                  direct=direct_io_works(workdir), storage=storage_for(path))


def direct_io_works(directory: str) -> bool:
    """Whether this file system accepts O_DIRECT (tmpfs before Linux 6.6 and many FUSE do not)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = os.path.join(directory, "direct.probe")
    buffer = _aligned(RAND_BLOCK)
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
        try:
            os.pwrite(fd, buffer, 0)
            os.preadv(fd, [buffer], 0)
        finally:
            os.close(fd)
        return True
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return False
        raise
    finally:
        buffer.close()
        if os.path.exists(probe):
            os.unlink(probe)


# -- the four measurements --------------------------------------------------------------------

class PathClock:
    """A path's budget as a deadline. Each pass gets its part of what is left when it starts, so a
    pass that ran long (fio's start-up, a slow final fsync) shortens those after it instead of the
    benchmark overrunning its budget; the last pass gets all that is left but the clean-up."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.end = clock() + seconds

    def share(self, phase: str) -> float:
        later = list(PHASE_SHARE)[list(PHASE_SHARE).index(phase):]
        left = self.end - self.clock() - CLEANUP_RESERVE_S
        if len(later) == 1:
            return max(MIN_PHASE_S, left)
        return max(MIN_PHASE_S, left * PHASE_SHARE[phase] / (sum(PHASE_SHARE[p] for p in later) + SPARE_PART))


def _measure(target: Target, engines: list, clock: PathClock, progress: Progress, results: list[dict]) -> None:
    """The four passes within the path's budget (fast disks finish each early)."""
    where, share = target.path, clock.share
    progress(f"disk {where}: sequential write")
    write, engine = _first_that_works(engines, "seq_write", target, share("seq_write"))
    checkpoint = checkpoint_write(target, CHECKPOINT_SECONDS)
    results.append(_seq_measurement("disk.seq_write", target, write, engine, checkpoint))
    written = write.bytes // SEQ_BLOCK * SEQ_BLOCK
    if written < SEQ_BLOCK:
        raise EngineError(f"the sequential write wrote only {write.bytes} bytes")

    progress(f"disk {where}: sequential read")
    read, engine = _first_that_works(engines, "seq_read", target, share("seq_read"), written)
    results.append(_seq_measurement("disk.seq_read", target, read, engine))

    progress(f"disk {where}: random 4 KiB reads")
    rand, engine = _first_that_works(engines, "rand_read", target, min(RAND_SECONDS, share("rand_read")), written)
    results.append(_rand_measurement(target, rand, engine))
    if os.path.exists(target.file):  # fio has unlinked it already
        os.unlink(target.file)

    progress(f"disk {where}: {target.small_files} small files")
    small = small_files(target, share("small_files"))
    results.append(_small_files_measurement(target, small))


def _first_that_works(engines: list, phase: str, target: Target, seconds: float, *args: int) -> tuple[Pass, str]:
    """Run `phase` on the first engine; with auto, a failing fio hands over to the built-in one."""
    failures = []
    for engine in engines:
        try:
            result = getattr(engine, phase)(target, seconds, *args)
        except EngineError as err:
            failures.append(f"{engine.name}: {err}")
            continue
        if failures:
            result.extra["fallback_reason"] = "; ".join(failures)
        return result, engine.name
    raise EngineError("; ".join(failures))


def _common_details(target: Target, engine: str, result: Pass) -> dict[str, Any]:
    storage = target.storage
    details = {"engine": engine, "cache": target.cache, "fs_type": storage.fs_type, "kind": storage.kind,
               "mount_point": storage.mount_point, "bytes": result.bytes, "runtime_s": round(result.seconds, 3)}
    if storage.model:
        details["model"] = storage.model
    return {**details, **result.extra}


# What both engines do in each pass (fio: the job's options; built-in: the same pattern).
SUBMIT = "each request submitted on its own as soon as one completes"
METHOD = {
    "disk.seq_write": f"sequential {SEQ_BLOCK // MIB} MiB writes, {SEQ_DEPTH} in flight, {SUBMIT}, into a "
                      "preallocated file; timed to the end of an fsync",
    "disk.seq_read": f"sequential {SEQ_BLOCK // MIB} MiB reads of the written file, {SEQ_DEPTH} in flight, {SUBMIT}",
    "disk.rand_read_iops": f"{RAND_BLOCK // KIB} KiB reads at uniform random {RAND_BLOCK // KIB} KiB-aligned offsets "
                           f"over the whole written file (repeats allowed, a fresh sequence each run), "
                           f"{RAND_DEPTH} in flight, {SUBMIT}; reads completed / seconds",
}


def _seq_measurement(name: str, target: Target, result: Pass, engine: str, checkpoint: Pass | None = None) -> dict:
    extra: dict[str, Any] = {}
    if checkpoint is not None:  # beside the direct figure: how a checkpoint is really written
        extra = {"checkpoint_mb_s": round(checkpoint.mb_s, 1), "checkpoint_bytes": checkpoint.bytes,
                 "checkpoint_fsync_s": checkpoint.extra.get("fsync_s"), "checkpoint_method": CHECKPOINT_METHOD}
    return measurement(name, round(result.mb_s, 1), "MB/s", target.path,
                       **_common_details(target, engine, result), block_size=SEQ_BLOCK, queue_depth=SEQ_DEPTH,
                       method=METHOD[name], **extra)


# A checkpoint is written as torch.save writes it: through the page cache, then one fsync (the
# seed's `dd conv=fdatasync` too). On some file systems that is ten times slower than O_DIRECT
# (1,740 MB/s direct, 93-240 MB/s torch.save + fsync on one directory), so both are timed.
CHECKPOINT_BYTES = 256 * MIB  # bounded: the fsync of what the page cache took must finish in the budget
CHECKPOINT_SECONDS = 3.0
CHECKPOINT_CHUNK = 4 * MIB
CHECKPOINT_METHOD = (f"up to {CHECKPOINT_BYTES // MIB} MiB written through the page cache in {CHECKPOINT_CHUNK // MIB} MiB "
                     "writes (as torch.save writes a file), then one fsync; bytes / (write + fsync) seconds")


def checkpoint_write(target: Target, seconds: float) -> Pass | None:
    """A buffered write plus fsync of up to CHECKPOINT_BYTES (less where the test may write less),
    stopped early after `seconds` of writing; None where the file system refused it."""
    path = f"{target.file}.checkpoint"
    size = min(CHECKPOINT_BYTES, target.size)
    chunk = _aligned(CHECKPOINT_CHUNK)
    written = 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            start = time.perf_counter()
            while written < size and time.perf_counter() - start < seconds:
                written += os.write(fd, chunk[: min(CHECKPOINT_CHUNK, size - written)])
            wrote = time.perf_counter()
            os.fsync(fd)
            done = time.perf_counter()
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
    except OSError:
        return None
    if written <= 0 or done <= start:
        return None
    return Pass(bytes=written, seconds=done - start, extra={"fsync_s": round(done - wrote, 3)})


def _rand_measurement(target: Target, result: Pass, engine: str) -> dict:
    name = "disk.rand_read_iops"
    return measurement(name, round(result.iops), "IOPS", target.path,
                       **_common_details(target, engine, result), block_size=RAND_BLOCK, queue_depth=RAND_DEPTH,
                       reads=result.ops, p50_us=_round(result.p50_us), p99_us=_round(result.p99_us),
                       method=METHOD[name])


def _small_files_measurement(target: Target, result: Pass) -> dict:
    return measurement("disk.small_files", round(result.ops / result.seconds, 1), "files/s", target.path,
                       **_common_details(target, "builtin", result), read_mb_s=round(result.mb_s, 1),
                       file_bytes=SMALL_FILE_BYTES, readers=SMALL_FILE_READERS,
                       p50_us=_round(result.p50_us), p99_us=_round(result.p99_us), method=SMALL_FILES_METHOD)


SMALL_FILES_METHOD = (f"{SMALL_FILE_BYTES // KIB} KiB files created with one write each (no fsync per file), one syncfs, "
                      "then each dropped from the page cache (posix_fadvise DONTNEED); read back whole in shuffled order "
                      f"by {SMALL_FILE_READERS} threads (open/read/close, like DataLoader workers), in rounds with the cache "
                      f"dropped before each, for at least {SMALL_READ_MIN_S:g} s; files read / seconds reading; p50/p99: "
                      "one file's open-read-close")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _engines(chosen: str, fio: str | None, fallback: bool) -> list:
    if chosen == "fio" and fio:
        return [FioEngine(fio), BuiltinEngine()] if fallback else [FioEngine(fio)]
    return [BuiltinEngine()]


# -- built-in engine --------------------------------------------------------------------------

def _aligned(size: int) -> mmap.mmap:
    """A page-aligned buffer, as O_DIRECT needs, filled with incompressible bytes."""
    buffer = mmap.mmap(-1, size)
    buffer.write(os.urandom(size))
    return buffer


def _drop_cache(fd: int) -> None:
    """Ask the kernel to forget this file's (clean) pages, so the next read goes to the device."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


class _Workers:
    """`count` threads running `work(index, stop)` together; errors come back to the caller."""

    def __init__(self, count: int, work: Callable[[int, threading.Event], Any]):
        self.stop = threading.Event()
        self.results: list[Any] = [None] * count
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i, work), daemon=True) for i in range(count)]

    def _run(self, index: int, work: Callable) -> None:
        try:
            self.results[index] = work(index, self.stop)
        except BaseException as err:  # noqa: BLE001 - handed to the caller below
            self.errors.append(err)
            self.stop.set()

    def run(self) -> list[Any]:
        try:
            for thread in self.threads:
                thread.start()
            for thread in self.threads:
                thread.join()
        except BaseException:  # Ctrl-C: let the threads see it before the files go away
            self.stop.set()
            for thread in self.threads:
                thread.join()
            raise
        if self.errors:
            err = self.errors[0]
            raise EngineError(f"{type(err).__name__}: {err}") from err
        return self.results


@dataclass
class Moved:
    """What a transfer loop did: requests, bytes, seconds, per-request latencies (ns) if kept."""

    ops: int
    bytes: int
    seconds: float
    latencies_ns: list[int]
    io: str  # "linux-aio" or "threads"


def transfer(fd: int, write: bool, block: int, depth: int, next_offset: Callable[[], int | None],
             seconds: float, direct: bool) -> Moved:
    """Keep `depth` requests of `block` bytes in flight at the offsets `next_offset` gives (None:
    done) until done or `seconds` have passed. Linux native AIO where it can work (O_DIRECT; the
    same mechanism as fio's libaio engine, one thread, little CPU), `depth` threads otherwise."""
    if direct and KernelAio.available():
        try:
            aio = KernelAio(depth)
        except EngineError:  # aio-max-nr reached, or a seccomp profile forbids it: threads still work
            aio = None
        if aio is not None:
            return aio.transfer(fd, write, block, next_offset, seconds)
    return _threaded_transfer(fd, write, block, depth, next_offset, seconds)


def _threaded_transfer(fd: int, write: bool, block: int, depth: int, next_offset: Callable[[], int | None],
                       seconds: float) -> Moved:
    def worker(_: int, stop: threading.Event) -> list[int]:
        buffer, latencies, clock = _aligned(block), [], time.perf_counter_ns
        try:
            while not stop.is_set() and clock() < deadline:
                offset = next_offset()
                if offset is None:
                    break
                before = clock()
                done = os.pwrite(fd, buffer, offset) if write else os.preadv(fd, [buffer], offset)
                if done != block:
                    raise EngineError(f"short {'write' if write else 'read'} at offset {offset}: {done} bytes")
                latencies.append(clock() - before)
        finally:
            buffer.close()
        return latencies

    start = time.perf_counter_ns()
    deadline = start + int(seconds * 1e9)
    latencies = list(itertools.chain.from_iterable(_Workers(depth, worker).run()))
    elapsed = (time.perf_counter_ns() - start) / 1e9
    return Moved(len(latencies), len(latencies) * block, elapsed, latencies, "threads")


def _sequential(size: int, block: int) -> Callable[[], int | None]:
    """Offsets 0, block, 2*block ... below `size`, shared by all requesters."""
    blocks, last = itertools.count(), size // block  # next() on a count is atomic under the GIL

    def next_offset() -> int | None:
        index = next(blocks)
        return index * block if index < last else None

    return next_offset


def _random(size: int, block: int, seed: int | None = None) -> Callable[[], int]:
    """Uniform block-aligned offsets below `size`, as fio's job draws them (--norandommap:
    repeats allowed; --randrepeat=0: a fresh sequence each run, so no run re-reads the blocks
    an earlier run left in a cache, such as a virtual disk's host page cache)."""
    uniform, blocks = random.Random(seed).random, size // block
    return lambda: int(uniform() * blocks) * block


class BuiltinEngine:
    """gpuvet's own engine: the fio jobs' access patterns through `transfer`."""

    name = "builtin"

    def _open(self, target: Target, flags: int) -> int:
        return os.open(target.file, flags | (os.O_DIRECT if target.direct else 0), 0o600)

    def seq_write(self, target: Target, seconds: float) -> Pass:
        fd = self._open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            _preallocate(fd, target.size)  # as fio does: writes into an extending file serialise
            moved = transfer(fd, True, SEQ_BLOCK, SEQ_DEPTH, _sequential(target.size, SEQ_BLOCK), seconds, target.direct)
            start = time.perf_counter()
            os.fsync(fd)  # O_DIRECT leaves the drive's cache and metadata; without it, everything
            flush = time.perf_counter() - start
        finally:
            os.close(fd)
        return Pass(bytes=moved.bytes, seconds=moved.seconds + flush, ops=moved.ops,
                    extra={"io": moved.io, "fsync_s": round(flush, 3)})

    def seq_read(self, target: Target, seconds: float, size: int) -> Pass:
        moved = self._read(target, SEQ_BLOCK, SEQ_DEPTH, _sequential(size, SEQ_BLOCK), seconds)
        return Pass(bytes=moved.bytes, seconds=moved.seconds, ops=moved.ops, extra={"io": moved.io})

    def rand_read(self, target: Target, seconds: float, size: int) -> Pass:
        moved = self._read(target, RAND_BLOCK, RAND_DEPTH, _random(size, RAND_BLOCK), seconds)
        if not moved.ops:
            raise EngineError("no random read completed")
        latencies = sorted(moved.latencies_ns)
        return Pass(bytes=moved.bytes, seconds=moved.seconds, ops=moved.ops, extra={"io": moved.io},
                    p50_us=quantile(latencies, 0.50) / 1e3, p99_us=quantile(latencies, 0.99) / 1e3)

    def _read(self, target: Target, block: int, depth: int, next_offset: Callable[[], int | None],
              seconds: float) -> Moved:
        """Reads of the written file, cold: from the device, not the page cache."""
        fd = self._open(target, os.O_RDONLY)
        try:
            if not target.direct:
                _drop_cache(fd)
            return transfer(fd, False, block, depth, next_offset, seconds, target.direct)
        finally:
            os.close(fd)


def _preallocate(fd: int, size: int) -> None:
    """Reserve the file's blocks (fallocate(2)); where the file system cannot, writes just extend."""
    libc = _libc()
    fallocate = getattr(libc, "fallocate", None) if libc else None
    if fallocate is not None:
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        fallocate(fd, 0, 0, size)  # failure (EOPNOTSUPP on NFSv3...) is fine


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


# -- Linux native AIO -------------------------------------------------------------------------

class _Iocb(ctypes.Structure):
    """struct iocb (linux/aio_abi.h), little-endian layout, 64 bytes."""

    _fields_ = [("data", ctypes.c_uint64), ("key", ctypes.c_uint32), ("rw_flags", ctypes.c_int32),
                ("opcode", ctypes.c_uint16), ("reqprio", ctypes.c_int16), ("fildes", ctypes.c_uint32),
                ("buf", ctypes.c_uint64), ("nbytes", ctypes.c_uint64), ("offset", ctypes.c_int64),
                ("reserved2", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("resfd", ctypes.c_uint32)]


class _IoEvent(ctypes.Structure):
    """struct io_event: which request (data) finished and its result (bytes or -errno)."""

    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64), ("res", ctypes.c_int64), ("res2", ctypes.c_int64)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class KernelAio:
    """io_setup / io_submit / io_getevents (the kernel AIO that fio's libaio engine uses), called
    through syscall(2) so no library is needed. One thread keeps `depth` requests in flight."""

    # (io_setup, io_destroy, io_submit, io_getevents) numbers; the struct layout is little-endian.
    SYSCALLS = {"x86_64": (206, 207, 209, 208), "aarch64": (0, 1, 2, 4)}
    PREAD, PWRITE = 0, 1

    @classmethod
    def available(cls) -> bool:
        return (sys.platform.startswith("linux") and sys.byteorder == "little"
                and platform.machine() in cls.SYSCALLS and ctypes.sizeof(_Iocb) == 64)

    def __init__(self, depth: int):
        self.depth = depth
        setup, self.destroy, self.submit, self.getevents = self.SYSCALLS[platform.machine()]
        self.syscall = ctypes.CDLL(None, use_errno=True).syscall
        self.syscall.restype = ctypes.c_long
        self.context = ctypes.c_ulong(0)
        self._call(setup, ctypes.c_long(depth), ctypes.byref(self.context))

    def _call(self, number: int, *args: Any) -> int:
        while True:
            result = self.syscall(ctypes.c_long(number), *args)
            if result >= 0:
                return result
            error = ctypes.get_errno()
            if error != errno.EINTR:  # Ctrl-C: Python raises KeyboardInterrupt on return
                raise EngineError(f"kernel AIO syscall {number} failed: {os.strerror(error)}")

    def transfer(self, fd: int, write: bool, block: int, next_offset: Callable[[], int | None], seconds: float) -> Moved:
        """Run the loop once; the AIO context is destroyed afterwards (one transfer per instance)."""
        buffers = None
        try:
            buffers = _aligned(block * self.depth)
            return self._loop(self.context, fd, write, block, buffers, next_offset, seconds)
        finally:
            self._call(self.destroy, self.context)  # waits for requests in flight: only then free buffers
            if buffers is not None:
                buffers.close()

    def _loop(self, context: ctypes.c_ulong, fd: int, write: bool, block: int, buffers: mmap.mmap,
              next_offset: Callable[[], int | None], seconds: float) -> Moved:
        """fio's libaio loop at its defaults (iodepth_batch_submit=1): every request goes to the
        kernel in an io_submit of its own the moment its slot is free, so the device always has
        `depth` requests and starts on the first while the next are prepared. Submitting a batch
        of completed slots in one io_submit instead lets the queue run in lock-step bursts: on a
        virtio disk that read 15-20% fewer 4 KiB IOPS than fio. Completions are reaped all at
        once (fio takes one per io_getevents call): fewer Python calls, the same requests."""
        base = ctypes.addressof(ctypes.c_char.from_buffer(buffers))
        # The kernel's structures live in bytearrays, so the hot loop reads and writes them as
        # plain int64 views: far cheaper per request than ctypes attribute access.
        raw_requests, raw_events = bytearray(64 * self.depth), bytearray(32 * self.depth)
        requests = (_Iocb * self.depth).from_buffer(raw_requests)
        for slot, request in enumerate(requests):
            request.data, request.fildes, request.nbytes = slot, fd, block
            request.opcode = self.PWRITE if write else self.PREAD
            request.buf = base + slot * block
        # io_submit takes an array of iocb pointers: each slot's is a one-element array of its own.
        pointers = (ctypes.c_uint64 * self.depth)(*(ctypes.addressof(request) for request in requests))
        slot_array = [ctypes.c_void_p(ctypes.addressof(pointers) + 8 * slot) for slot in range(self.depth)]
        request_words, event_words = memoryview(raw_requests).cast("q"), memoryview(raw_events).cast("q")
        offset_word, stride = _Iocb.offset.offset // 8, ctypes.sizeof(_Iocb) // 8
        events_at = ctypes.c_void_p(ctypes.addressof((ctypes.c_char * len(raw_events)).from_buffer(raw_events)))
        syscall, submit = self.syscall, ctypes.c_long(self.submit)
        one, depth = ctypes.c_long(1), ctypes.c_long(self.depth)
        wait = ctypes.byref(_Timespec(0, 200_000_000))  # wake up now and then even if a request hangs
        clock, submitted_at, latencies = time.perf_counter_ns, [0] * self.depth, []
        start = clock()
        deadline = start + int(seconds * 1e9)

        def send(slot: int) -> int:
            """Submit `slot` at the next offset: 1, or 0 when there is none (all done)."""
            offset = next_offset()
            if offset is None:
                return 0
            request_words[slot * stride + offset_word] = offset
            submitted_at[slot] = clock()
            if syscall(submit, context, one, slot_array[slot]) != 1:  # rare: retry on EINTR, else raise
                self._call(self.submit, context, one, slot_array[slot])
            return 1

        in_flight = sum(send(slot) for slot in range(self.depth))
        while in_flight:
            finished = self._call(self.getevents, context, one, depth, events_at, wait)
            now = clock()
            more = now < deadline
            for index in range(0, 4 * finished, 4):  # io_event: data, obj, res, res2
                slot, result = event_words[index], event_words[index + 2]
                if result != block:
                    what = os.strerror(-result) if result < 0 else f"{result} of {block} bytes"
                    raise EngineError(f"{'write' if write else 'read'} failed: {what}")
                latencies.append(now - submitted_at[slot])
                in_flight += (send(slot) if more else 0) - 1
        elapsed = (clock() - start) / 1e9
        return Moved(len(latencies), len(latencies) * block, elapsed, latencies, "linux-aio")


# -- fio engine -------------------------------------------------------------------------------

class FioEngine:
    """The same passes through fio: libaio at the built-in engine's depths, on the same file."""

    name = "fio"

    def __init__(self, binary: str, unlink: bool = True):
        self.binary = binary
        self.unlink = unlink  # remove the file after the last pass (our temporary directory goes anyway)

    def seq_write(self, target: Target, seconds: float) -> Pass:
        job = self._run(target, seconds, "write", SEQ_BLOCK, SEQ_DEPTH, target.size, "--end_fsync=1")
        return self._pass(job, "write")

    def seq_read(self, target: Target, seconds: float, size: int) -> Pass:
        return self._pass(self._run(target, seconds, "read", SEQ_BLOCK, SEQ_DEPTH, size), "read")

    def rand_read(self, target: Target, seconds: float, size: int) -> Pass:
        job = self._run(target, seconds, "randread", RAND_BLOCK, RAND_DEPTH, size, "--time_based",
                        "--norandommap", "--randrepeat=0", "--lat_percentiles=1", f"--unlink={int(self.unlink)}")
        result = self._pass(job, "read")
        stats = job["read"]
        percentiles = (stats.get("lat_ns") or {}).get("percentile") or (stats.get("clat_ns") or {}).get("percentile") or {}
        result.ops = int(stats.get("total_ios") or round(stats["iops"] * result.seconds))
        result.p50_us = _ns_to_us(percentiles.get("50.000000"))
        result.p99_us = _ns_to_us(percentiles.get("99.000000"))
        return result

    def _run(self, target: Target, seconds: float, rw: str, block: int, depth: int, size: int, *extra: str) -> dict:
        # --thread: the job runs inside fio's own process. By default fio forks it into a process
        # group of its own, which outlives a killed fio (and a killed gpuvet) until its runtime ends.
        command = [self.binary, "--output-format=json", "--name=gpuvet", f"--filename={_fio_path(target.file)}",
                   f"--rw={rw}", f"--bs={block}", f"--size={size}", f"--runtime={max(100, int(seconds * 1000))}ms",
                   "--ioengine=libaio", f"--iodepth={depth}", f"--direct={int(target.direct)}", "--invalidate=1",
                   "--thread", *extra]
        stdout, stderr, returncode = run_to_the_end(command, seconds + FIO_SLACK_S)
        return _fio_job(stdout, stderr, returncode)

    @staticmethod
    def _pass(job: dict, direction: str) -> Pass:
        stats = job[direction]
        runtime_s = (stats.get("runtime") or job.get("job_runtime") or 0) / 1e3
        if runtime_s <= 0 or not stats.get("io_bytes"):
            raise EngineError(f"fio measured no {direction}s")
        return Pass(bytes=int(stats["io_bytes"]), seconds=runtime_s, ops=int(stats.get("total_ios") or 0))


def run_to_the_end(command: list[str], timeout: float) -> tuple[str, str, int]:
    """Run an external tool in a session of its own (a Ctrl-C at the terminal reaches gpuvet, not
    it), and kill it on a timeout, Ctrl-C, SIGTERM or any error: it never outlives the benchmark."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(process)
        raise EngineError(f"{os.path.basename(command[0])} did not finish within {timeout:.0f} s") from None
    except BaseException:
        _kill_session(process)
        raise
    return stdout, stderr, process.returncode


def _kill_session(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # the tool and anything it started in its session
    with contextlib.suppress(Exception):
        process.communicate(timeout=5)


def _fio_path(path: str) -> str:
    return path.replace(":", "\\:")  # fio splits --filename on ':'


def _ns_to_us(value: Any) -> float | None:
    return None if value is None else float(value) / 1e3


def parse_fio_json(text: str) -> dict:
    """fio's --output-format=json, even with warnings printed ahead of it."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in fio output")
    return json.loads(text[start:])


def _fio_job(stdout: str, stderr: str, returncode: int) -> dict:
    try:
        jobs = parse_fio_json(stdout).get("jobs") or []
    except ValueError:
        jobs = []
    error = jobs[0].get("error") if jobs else None
    if returncode != 0 or not jobs or error:
        lines = [line for line in (stderr + "\n" + stdout).splitlines() if line.strip() and not line.startswith(("{", " "))]
        why = lines[-1] if lines else f"exit status {returncode}"
        raise EngineError(f"fio failed: {why}")
    return jobs[0]


# -- small files (built-in for every engine) --------------------------------------------------

def small_files(target: Target, seconds: float) -> Pass:
    """Create `target.small_files` 16 KiB files in half of `seconds` (past it towards SMALL_FILES_MIN
    where the space allows, in the time the reads do not need), flush them to the device, drop them
    from the page cache, and read them back in shuffled order, SMALL_FILE_READERS threads like
    DataLoader workers, in rounds until the reads have taken SMALL_READ_MIN_S (or what is left of
    `seconds`). A disk that creates files slowly ends with fewer: `files` and `write_files_s` say so."""
    paths = _small_file_paths(target)
    for directory in sorted({os.path.dirname(p) for p in paths}):
        os.makedirs(directory, exist_ok=True)
    start = time.perf_counter()
    written = _write_small_files(paths, seconds / 2, at_least=min(len(paths), SMALL_FILES_MIN),
                                 until_s=seconds - SMALL_READ_MIN_S)
    _sync_file_system(target.workdir)
    write_seconds = time.perf_counter() - start
    if not written:
        raise EngineError("could not write a single small file in time")
    read_seconds, files, latencies, rounds = _read_rounds(written, max(seconds - write_seconds, SMALL_READ_MIN_S))
    latencies.sort()
    return Pass(bytes=files * SMALL_FILE_BYTES, seconds=read_seconds, ops=files,
                p50_us=quantile(latencies, 0.50) / 1e3 if latencies else None,
                p99_us=quantile(latencies, 0.99) / 1e3 if latencies else None,
                extra={"files": len(written), "write_files_s": round(len(written) / write_seconds, 1),
                       "read_rounds": rounds, "cache": "fsync+fadvise"})


def _small_file_paths(target: Target) -> list[str]:
    root = os.path.join(target.workdir, "small")
    return [os.path.join(root, f"d{i // FILES_PER_DIR:03d}", f"f{i:05d}.bin") for i in range(target.small_files)]


def _write_small_files(paths: list[str], seconds: float, at_least: int = 0, until_s: float = 0.0) -> list[str]:
    """Create files until done or out of time (`seconds`; up to `until_s` while fewer than
    `at_least` exist); returns those written (each one whole). One os.write per file, no
    fsync: the caller flushes them all at once, as a dataset copied to a disk is."""
    body = os.urandom(SMALL_FILE_BYTES - 8)  # incompressible; each file starts with its own number
    cursor = itertools.count()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)

    def writer(_: int, stop: threading.Event) -> list[str]:
        done = []
        while not stop.is_set():
            now = time.perf_counter()
            index = next(cursor)
            if index >= len(paths) or now >= hard_deadline or (now >= deadline and index >= at_least):
                break
            fd = os.open(paths[index], flags, 0o600)
            try:
                if os.write(fd, index.to_bytes(8, "little") + body) != SMALL_FILE_BYTES:
                    raise EngineError(f"short write to {paths[index]}")
            finally:
                os.close(fd)
            done.append(paths[index])
        return done

    start = time.perf_counter()
    deadline, hard_deadline = start + seconds, start + max(seconds, until_s)
    return list(itertools.chain.from_iterable(_Workers(SMALL_FILE_READERS, writer).run()))


def _read_rounds(files: list[str], seconds: float) -> tuple[float, int, list[int], int]:
    """Cold reads of `files` in shuffled rounds until SMALL_READ_MIN_S of reading (or `seconds`):
    (seconds reading, files read, per-file latencies in ns, rounds). Each round starts with every
    file dropped from the page cache (untimed), so no round reads from memory."""
    total_s, total_files, rounds = 0.0, 0, 0
    latencies: list[int] = []
    wall_end = time.perf_counter() + 3 * seconds  # the untimed cache drops count here
    while True:
        for path in files:
            _forget(path)
        order = list(files)
        random.Random(rounds).shuffle(order)
        elapsed, done = _read_small_files(order, seconds - total_s, latencies)
        total_s, total_files, rounds = total_s + elapsed, total_files + done, rounds + 1
        if done < len(order) or total_s >= SMALL_READ_MIN_S or time.perf_counter() >= wall_end:
            return total_s, total_files, latencies, rounds


def _sync_file_system(directory: str) -> None:
    """syncfs(2) on this file system only; sync(2) where libc has no syncfs."""
    libc = _libc()
    syncfs = getattr(libc, "syncfs", None) if libc else None
    if syncfs is None:
        os.sync()
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def _forget(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _drop_cache(fd)
    finally:
        os.close(fd)


def _read_small_files(order: list[str], seconds: float, latencies: list[int] | None = None) -> tuple[float, int]:
    """Read `order` whole, SMALL_FILE_READERS threads, for at most `seconds`: (seconds, files read).
    Each file's open-read-close time (ns) goes to `latencies`."""
    cursor = itertools.count()
    clock = time.perf_counter_ns

    def reader(_: int, stop: threading.Event) -> list[int]:
        times = []
        while not stop.is_set() and clock() < deadline:
            index = next(cursor)
            if index >= len(order):
                break
            before = clock()
            with open(order[index], "rb", buffering=0) as f:  # open/read/close, like PIL.Image.open
                while f.read(SMALL_FILE_BYTES):
                    pass
            times.append(clock() - before)
        return times

    start = clock()
    deadline = start + int(seconds * 1e9)
    per_reader = _Workers(SMALL_FILE_READERS, reader).run()
    elapsed = (clock() - start) / 1e9
    files = list(itertools.chain.from_iterable(per_reader))
    if latencies is not None:
        latencies += files
    return elapsed, len(files)
