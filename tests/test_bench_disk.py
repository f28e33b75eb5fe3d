"""The disk benchmark on this machine's real disk: both engines, the page cache kept out, test
files always removed, and clear skips for directories it cannot use."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuvet.bench import disk
from gpuvet.probe.host import storage_for

ROOT = Path(__file__).resolve().parent.parent
SMALL = 64 * disk.MIB  # test size: big enough to time, small enough to keep each run ~1.5 s
BUDGET_S = 2.0
FIGURES = ("disk.seq_write", "disk.seq_read", "disk.rand_read_iops", "disk.small_files")


@pytest.fixture
def disk_dir(tmp_path):
    """A directory on a real disk: tmp_path unless that is tmpfs (RAM), else one in the project."""
    if storage_for(str(tmp_path)).kind != "tmpfs":
        yield str(tmp_path)
        return
    directory = tempfile.mkdtemp(prefix="disk-test-", dir=ROOT)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def no_fio(empty_path):
    assert disk.find_fio() is None


needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install fio)")


def leftovers(directory: str) -> list[str]:
    return [name for name in os.listdir(directory) if name.startswith(disk.TEMP_PREFIX)]


def by_name(results: list[dict]) -> dict[str, dict]:
    return {m["name"]: m for m in results}


def check_figures(results: list[dict], directory: str, engine: str) -> dict[str, dict]:
    found = by_name(results)
    assert "bench.disk" not in found, found.get("bench.disk")
    assert set(found) == set(FIGURES)
    kind = storage_for(directory).kind
    for name in FIGURES:
        m = found[name]
        assert m["subject"] == directory and m["value"] > 0
        assert m["details"]["kind"] == kind and m["details"]["fs_type"]
        assert m["details"]["engine"] == (engine if name != "disk.small_files" else "builtin")
    rand = found["disk.rand_read_iops"]["details"]
    assert rand["queue_depth"] == disk.RAND_DEPTH and rand["block_size"] == 4096
    assert 0 < rand["p50_us"] <= rand["p99_us"]
    for name in ("disk.seq_write", "disk.seq_read", "disk.rand_read_iops"):  # the same job on either engine
        assert found[name]["details"]["method"] == disk.METHOD[name]
    assert found["disk.seq_write"]["details"]["bytes"] <= SMALL
    assert found["disk.small_files"]["details"]["files"] >= 10  # thousands in a real run; the test's budget is tiny
    return found


# -- both engines, really run -----------------------------------------------------------------

@needs_fio
def test_fio_engine_measures_all_four(disk_dir):
    found = check_figures(disk.run([disk_dir], engine="fio", budget_s=BUDGET_S, max_bytes=SMALL), disk_dir, "fio")
    assert found["disk.seq_read"]["details"]["cache"] in ("O_DIRECT", "fsync+fadvise")
    assert leftovers(disk_dir) == []


def test_builtin_engine_when_fio_is_hidden(disk_dir, no_fio, tmp_path):
    missing = str(tmp_path / "gone")  # and a second path it cannot use: a note for that one only
    results = disk.run([missing, disk_dir], budget_s=2 * BUDGET_S, max_bytes=SMALL)
    assert [m["name"] for m in results if m["subject"] == missing] == ["bench.disk"]
    found = check_figures([m for m in results if m["subject"] == disk_dir], disk_dir, "builtin")
    details = found["disk.seq_read"]["details"]
    if details["cache"] == "O_DIRECT" and disk.KernelAio.available():
        assert details["io"] == "linux-aio"
    assert leftovers(disk_dir) == []


def test_builtin_engine_without_o_direct_flushes_and_drops_the_cache(disk_dir, no_fio, monkeypatch):
    monkeypatch.setattr(disk, "direct_io_works", lambda directory: False)  # as on a FUSE mount
    found = check_figures(disk.run([disk_dir], budget_s=BUDGET_S, max_bytes=SMALL), disk_dir, "builtin")
    assert {m["details"]["cache"] for m in found.values()} == {"fsync+fadvise"}
    assert found["disk.rand_read_iops"]["details"]["io"] == "threads"
    assert found["disk.seq_write"]["details"]["fsync_s"] >= 0


def test_fio_requested_but_missing_is_a_skip_note(disk_dir, no_fio):
    (note,) = disk.run([disk_dir], engine="fio")
    assert note["name"] == "bench.disk" and note["details"]["outcome"] == "skipped"
    assert "fio is not installed" in note["details"]["reason"] and leftovers(disk_dir) == []


# -- the page cache stays out (checked with mincore(2), which reads nothing itself) -----------

def resident_bytes(path: str) -> int:
    """Bytes of `path` in the page cache: mmap the file and ask mincore which pages are resident."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size, page = os.path.getsize(path), os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            pages = ctypes.create_string_buffer((size + page - 1) // page)
            assert libc.mincore(address, size, pages) == 0, os.strerror(ctypes.get_errno())
            return sum(byte & 1 for byte in pages.raw) * page
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


@pytest.fixture
def mincore_works(disk_dir):
    if not sys.platform.startswith("linux"):
        pytest.skip("mincore residency check written for Linux")
    probe = os.path.join(disk_dir, "probe")
    with open(probe, "wb") as f:
        f.write(b"x" * 65536)
    try:
        if resident_bytes(probe) != 65536:
            pytest.skip("mincore does not report this file system's page cache")
    finally:
        os.unlink(probe)


def target_in(directory: str, direct: bool) -> disk.Target:
    return disk.Target(path=directory, workdir=directory, file=os.path.join(directory, "seq.bin"), size=SMALL // 4,
                       small_files=0, direct=direct, storage=storage_for(directory))


def test_direct_io_never_fills_the_page_cache(disk_dir, mincore_works):
    target = target_in(disk_dir, direct=disk.direct_io_works(disk_dir))
    if not target.direct:
        pytest.skip("this file system refuses O_DIRECT")
    engine = disk.BuiltinEngine()
    written = engine.seq_write(target, 5.0).bytes
    assert written == target.size and resident_bytes(target.file) == 0
    engine.seq_read(target, 5.0, written)
    engine.rand_read(target, 0.2, written)
    assert resident_bytes(target.file) == 0


def test_fadvise_drops_a_flushed_file_from_the_cache(disk_dir, mincore_works):
    """The fallback where O_DIRECT is refused: written pages are flushed, then dropped."""
    path = os.path.join(disk_dir, "buffered.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    assert resident_bytes(path) == 1 << 20
    fd = os.open(path, os.O_RDONLY)
    try:
        disk._drop_cache(fd)
    finally:
        os.close(fd)
    assert resident_bytes(path) == 0


# -- the built-in engine does what fio's job does ---------------------------------------------

def test_builtin_aio_submits_each_request_alone_as_fio_does(disk_dir):
    """fio's libaio engine at its defaults (iodepth_batch_submit=1) hands every request to the
    kernel in an io_submit of its own; batching the refills ran the queue in lock-step bursts
    and read 15-20% fewer IOPS than fio on a virtio disk."""
    target = target_in(disk_dir, direct=disk.direct_io_works(disk_dir))
    if not (target.direct and disk.KernelAio.available()):
        pytest.skip("no O_DIRECT or no kernel AIO here: the threaded fallback has no io_submit")
    written = disk.BuiltinEngine().seq_write(target, 5.0).bytes
    aio = disk.KernelAio(8)
    real, batches = aio.syscall, []

    def spy(number, *args):
        if number.value == aio.submit:
            batches.append(args[1].value)
        return real(number, *args)

    aio.syscall = spy
    fd = os.open(target.file, os.O_RDONLY | os.O_DIRECT)
    try:
        moved = aio.transfer(fd, False, disk.RAND_BLOCK, disk._random(written, disk.RAND_BLOCK), 0.2)
    finally:
        os.close(fd)
    assert moved.ops >= 8 and set(batches) == {1} and len(batches) == moved.ops  # all reaped at the end
    assert len(moved.latencies_ns) == moved.ops and min(moved.latencies_ns) > 0


def test_random_offsets_are_uniform_aligned_and_fresh_each_run():
    """fio --norandommap --randrepeat=0: block-aligned, anywhere in the file, repeats allowed,
    and not the same sequence every run (which a host's page cache would learn)."""
    size, block = 64 * disk.MIB, disk.RAND_BLOCK
    first, second = disk._random(size, block), disk._random(size, block)
    offsets = [first() for _ in range(20_000)]
    assert all(o % block == 0 and 0 <= o < size for o in offsets)
    assert min(offsets) < size // 16 and max(offsets) >= size - size // 16  # the whole file
    assert offsets[:100] != [second() for _ in range(100)]
    seeded = [disk._random(size, block, seed=7) for _ in range(2)]
    assert [seeded[0]() for _ in range(10)] == [seeded[1]() for _ in range(10)]


# -- test files are always removed ------------------------------------------------------------

def interrupt_at(phase: str):
    def progress(message: str) -> None:
        if phase in message:
            raise KeyboardInterrupt
    return progress


@pytest.mark.parametrize("engine", [pytest.param("fio", marks=needs_fio), "builtin"])
def test_ctrl_c_between_passes_removes_the_test_files(disk_dir, engine):
    with pytest.raises(KeyboardInterrupt):
        disk.run([disk_dir], engine=engine, budget_s=BUDGET_S, max_bytes=SMALL, progress=interrupt_at("random"))
    assert leftovers(disk_dir) == []


def test_error_in_the_middle_of_random_reads_keeps_earlier_figures_and_cleans_up(disk_dir, no_fio, monkeypatch):
    def failing_offsets(size: int, block: int, seed: int | None = None):
        calls = iter(range(200))
        def next_offset() -> int:
            if next(calls, None) is None:
                raise OSError(errno.EIO, "injected IO error")
            return 0
        return next_offset

    monkeypatch.setattr(disk, "_random", failing_offsets)  # fails with requests in flight
    results = by_name(disk.run([disk_dir], budget_s=BUDGET_S, max_bytes=SMALL))
    assert results["disk.seq_write"]["value"] > 0 and results["disk.seq_read"]["value"] > 0
    note = results["bench.disk"]["details"]
    assert note["outcome"] == "failed" and "injected IO error" in note["reason"]
    assert leftovers(disk_dir) == []


def test_small_files_are_thousands_read_cold_for_long_enough(disk_dir, no_fio):
    """The audit saw 999 files read in 61 ms: now at least SMALL_FILES_MIN files where the space
    allows, and the reads repeat (cache dropped each round) until SMALL_READ_MIN_S has passed."""
    workdir = tempfile.mkdtemp(prefix=disk.TEMP_PREFIX, dir=disk_dir)
    try:
        target = disk._target(disk_dir, workdir, disk.GIB)
        assert target.small_files >= disk.SMALL_FILES_MIN
        seconds = 4.0  # creation may pass its half (2 s) to reach the minimum, up to what the reads need
        result = disk.small_files(target, seconds)
        files, rate = result.extra["files"], result.extra["write_files_s"]
        # only a disk too slow to create them in the time the reads leave stops short
        assert files >= disk.SMALL_FILES_MIN or files / rate >= seconds - disk.SMALL_READ_MIN_S
        assert result.seconds >= disk.SMALL_READ_MIN_S and result.extra["read_rounds"] >= 1
        assert 0 < result.p50_us <= result.p99_us
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_ctrl_c_while_reading_small_files_removes_them(disk_dir, no_fio, monkeypatch):
    def interrupted(order, seconds, latencies=None):
        assert order and all(os.path.exists(p) for p in order)  # the small files exist now
        raise KeyboardInterrupt

    monkeypatch.setattr(disk, "_read_small_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        disk.run([disk_dir], budget_s=BUDGET_S / 2, max_bytes=SMALL)
    assert leftovers(disk_dir) == []


# -- directories it cannot use ----------------------------------------------------------------

def only_note(results: list[dict]) -> dict:
    (note,) = results
    assert note["name"] == "bench.disk" and note["value"] is None and note["details"]["outcome"] == "skipped"
    return note


def test_missing_directory_and_file_are_skipped(tmp_path):
    missing = str(tmp_path / "nope")
    assert "does not exist" in only_note(disk.run([missing]))["details"]["reason"]
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "not a directory" in only_note(disk.run([str(a_file)]))["details"]["reason"]


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory gpuvet cannot write in: a read-only bind mount as root, mode 0555 otherwise."""
    directory = tmp_path / "ro"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o555)
        yield str(directory), "no permission"
        directory.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(directory), str(directory)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"root without mount rights: {mounted.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True, capture_output=True)
        yield str(directory), "read-only file system"
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_read_only_directory_is_a_clear_skip(read_only_dir):
    directory, why = read_only_dir
    reason = only_note(disk.run([directory]))["details"]["reason"]
    assert why in reason and reason.endswith(directory)  # the user's path, not gpuvet's temporary directory


def test_full_disk_is_a_skip_and_writes_nothing(disk_dir, monkeypatch):
    monkeypatch.setattr(disk, "free_bytes", lambda path: 200 * disk.MIB)
    reason = only_note(disk.run([disk_dir]))["details"]["reason"]
    assert reason.startswith("only 200 MiB free: the disk test needs 320 MiB free") and leftovers(disk_dir) == []


@pytest.mark.parametrize("free, expected", [
    (100 * disk.GIB, disk.GIB),  # capped at 1 GiB
    (2 * disk.GIB, 204 * disk.MIB),  # 10% of the free space, whole MiB
    (200 * disk.MIB, None),  # 20 MiB would be too little to measure
])
def test_test_size_is_a_tenth_of_free_space_at_most_1_gib(free, expected):
    assert disk.allowed_bytes(free) == expected


def test_not_writable_reasons_name_the_users_directory_not_the_temporary_one():
    err = OSError(errno.EROFS, "Read-only file system", "/data/.gpuvet-disk-x1y2")
    assert disk._not_writable(err, "/data") == "read-only file system: /data"
    assert "no permission to write in /data" in disk._not_writable(OSError(errno.EACCES, "Permission denied", "/data/.t"), "/data")
    assert "no space left" in disk._not_writable(OSError(errno.ENOSPC, "No space left", "/data/.t"), "/data")



# -- fio output -------------------------------------------------------------------------------

def test_fio_json_is_found_after_warnings_and_errors_are_reported():
    text = 'fio: this platform does not support process shared mutexes, forcing use of threads\n{"jobs": [{"error": 0, "read": {}}]}'
    assert disk.parse_fio_json(text)["jobs"][0]["error"] == 0
    with pytest.raises(disk.EngineError, match="O_DIRECT"):
        disk._fio_job('{"jobs": [{"error": 22}]}', "fio: looks like your file system does not support direct=1/buffered=0\n"
                      "fio: destination does not support O_DIRECT", 1)
    with pytest.raises(disk.EngineError, match="exit status 1"):
        disk._fio_job("", "", 1)


# -- which directories a run tests --------------------------------------------------------------

def test_path_adds_to_the_working_directory_and_the_checkpoint_keeps_the_first_path(tmp_path, monkeypatch):
    """`--path X` tests X besides the working directory (the help: "Test storage here too"); the
    same directory named twice is tested once; the workload still checkpoints to the first --path."""
    from gpuvet import runner
    from gpuvet.bench import plan as bench_plan

    work, data = tmp_path / "work", tmp_path / "data"
    work.mkdir(), data.mkdir()
    monkeypatch.chdir(work)
    tested, workload = [], {}

    def host_run(names, paths, engine, progress):
        tested.extend(paths)
        return [disk.note(path, "skipped", "synthetic: not measured in this test") for path in paths]

    def gpu_run(machine, names, **options):
        workload.update(options["workload"])
        return bench_plan.Outcome()

    monkeypatch.setattr(runner.host_plan, "run", host_run)
    monkeypatch.setattr(runner.bench_plan, "run", gpu_run)
    record = runner.run_live(benchmarks=["disk", "workload"], paths=[str(data), str(data) + "/", str(work)])
    assert tested == [str(work), str(data)]
    assert workload["path"] == str(data)
    assert {f.subject for f in record.findings if f.check.startswith("storage.") and f.check != "storage.workdir"} == \
        {str(work), str(data)}
    assert runner.storage_paths(str(work), None) == [str(work)]


def fio_processes_on(path: str) -> list[int]:
    """Processes whose command line names `path` (fio jobs on our test file)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if path.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@needs_fio
def test_an_interrupted_fio_run_leaves_no_fio_behind(disk_dir):
    """Ctrl-C (or SIGTERM, which gpuvet turns into one) in the middle of a fio pass: fio and its
    job are gone when gpuvet's handler runs, not seconds later when fio's runtime ends."""
    import signal

    workdir = tempfile.mkdtemp(prefix=disk.TEMP_PREFIX, dir=disk_dir)
    target = disk._target(disk_dir, workdir, SMALL)
    with open(target.file, "wb") as f:  # the file exists: fio starts its job at once, no layout first
        f.truncate(SMALL)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)  # fio's job is running by then: the pass lasts 5 s
        with pytest.raises(KeyboardInterrupt):
            disk.FioEngine(shutil.which("fio"))._run(target, 5.0, "randread", 4096, 32, SMALL, "--time_based")
        assert fio_processes_on(target.file) == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_pass_that_runs_long_shortens_the_later_ones_so_the_path_keeps_its_budget():
    """On a slow VM disk the test took 15-17 s of its 10 s: fio's start-up and final fsync and a
    slow file creation came on top of every pass's fixed share. Now each pass gets its part of
    what is left, the last one all that is left but the clean-up."""
    now = [0.0]
    clock = disk.PathClock(10.0, clock=lambda: now[0])
    first = clock.share("seq_write")
    assert first == pytest.approx((10.0 - disk.CLEANUP_RESERVE_S) * 0.25)
    now[0] = 6.0  # the write and its fsync took 6 s, not 2.25
    after = [clock.share(phase) for phase in ("seq_read", "rand_read")]
    assert after[0] < first and after[1] < first
    now[0] = 8.0
    last = clock.share("small_files")
    assert last == pytest.approx(10.0 - 8.0 - disk.CLEANUP_RESERVE_S)  # ends at the budget, less the clean-up
    now[0] = 30.0  # already over: each pass still gets its minimum instead of none
    assert clock.share("small_files") == disk.MIN_PHASE_S
