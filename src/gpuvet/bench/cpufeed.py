"""cpu.feed_rate: how many training images per second the CPU cores prepare (B9).

The seed's 8-core RTX 4090 instance trained a third slower than the 16-core one: the GPU waited
for the DataLoader. This benchmark measures what the DataLoader measures: one worker process per
usable core, each running the standard ImageNet training transform (torchvision's
`RandomResizedCrop(224)`, `RandomHorizontalFlip()`, `ToTensor()`, `Normalize(...)`) on JPEG
files of ImageNet's typical size, for a fixed time. The JPEGs are generated here at start
(gradients, shapes and multi-scale noise, encoded at quality 90), so nothing is downloaded.

Unlike the GPU benchmarks this runs in the caller's process tree: workers are `spawn`ed
multiprocessing processes (no torch import in the parent), and every worker is joined or killed
before `run` returns, also on Ctrl-C. A failure returns a `bench.cpu` note instead of raising.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import multiprocessing
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from .leftovers import signals_deferred

# ImageNet's most common image size is 500x375 (landscape) and its average training JPEG is
# about 110 KB (about 140 GB for 1.28 M images); the generated images aim for both.
IMAGE_WIDTH, IMAGE_HEIGHT = 500, 375
IMAGE_COUNT = 8  # cycled by every worker: decoding, not reading, is what is measured
JPEG_QUALITY = 90
CROP = 224
# RandomResizedCrop's defaults (from the Inception paper's augmentation).
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
# ImageNet channel statistics every torchvision ImageNet recipe normalizes with.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

WARMUP_SHARE = 0.15  # of the budget: caches, allocator and CPU frequency settle first
# The budget covers starting the workers too (a loaded machine starts processes slowly); what
# start-up leaves is the decoding window, never less than these.
MIN_WARMUP_S = 0.3
MIN_MEASURE_S = 1.0
START_TIMEOUT_S = 60.0  # spawning a worker per core and importing torch in each, on a slow disk
RESULT_GRACE_S = 3.0  # after the timed window, for the last sample and the result to arrive
STOP_WAIT_S = 2.0  # how long a worker gets to exit after terminate() before it is killed

STEPS = ("decode", "crop_resize", "flip", "to_tensor_normalize")


# -- generated images -------------------------------------------------------------------------

@functools.cache
def make_jpegs(count: int = IMAGE_COUNT, seed: int = 0) -> tuple[bytes, ...]:
    """`count` synthetic photo-like JPEGs of IMAGE_WIDTH x IMAGE_HEIGHT at JPEG_QUALITY (the same
    bytes for the same arguments, made once per process)."""
    return tuple(_encode(_synthetic_image(random.Random(seed + i))) for i in range(count))


def _synthetic_image(rng: random.Random):
    from PIL import Image, ImageDraw

    w, h = IMAGE_WIDTH, IMAGE_HEIGHT
    ramp = Image.linear_gradient("L").rotate(rng.uniform(0, 360), resample=Image.Resampling.BILINEAR).resize((w, h))
    glow = Image.radial_gradient("L").resize((w, h))
    img = Image.merge("RGB", (ramp, glow, Image.blend(ramp, glow, 0.5)))
    draw = ImageDraw.Draw(img)
    for _ in range(20):  # objects with edges, which JPEG spends bits on
        x0, y0 = rng.randrange(w), rng.randrange(h)
        box = (x0, y0, x0 + rng.randrange(10, 200), y0 + rng.randrange(10, 150))
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    return Image.merge("RGB", [Image.blend(band, _texture(w, h), 0.5) for band in img.split()])


def _texture(w: int, h: int):
    """Noise at three scales (blotches to grain): compresses like the detail of a photo, where
    plain white noise would be far larger and plain gradients far smaller."""
    from PIL import Image

    layers = [Image.effect_noise((max(1, w // s), max(1, h // s)), 90).resize((w, h), Image.Resampling.BICUBIC)
              for s in (16, 4, 1)]
    return Image.blend(Image.blend(layers[0], layers[1], 0.5), layers[2], 0.5)


def _encode(img) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, "JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


# -- the transform a DataLoader worker runs -----------------------------------------------------

def random_resized_crop_box(width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a RandomResizedCrop: 8-100% of the area, aspect 3/4..4/3,
    ten tries, then a centre crop with the aspect clamped (the same rule as torchvision)."""
    area = width * height
    log_low, log_high = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    for _ in range(10):
        target = area * rng.uniform(*CROP_SCALE)
        ratio = math.exp(rng.uniform(log_low, log_high))
        w = round(math.sqrt(target * ratio))
        h = round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            left, top = rng.randint(0, width - w), rng.randint(0, height - h)
            return left, top, left + w, top + h
    ratio = width / height
    if ratio < CROP_RATIO[0]:
        w, h = width, round(width / CROP_RATIO[0])
    elif ratio > CROP_RATIO[1]:
        w, h = round(height * CROP_RATIO[1]), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


class Pipeline:
    """Decode, RandomResizedCrop, flip, to float CHW tensor, normalize; each step timed."""

    def __init__(self, use_torch: bool | None, seed: int):
        from PIL import Image

        self.image = Image
        self.rng = random.Random(seed)
        self.torch = _import_torch() if use_torch is not False else None
        if use_torch and self.torch is None:
            raise RuntimeError("torch was asked for but cannot be imported")
        if self.torch is not None:
            self.torch.set_num_threads(1)  # as in a DataLoader worker
            self.mean = self.torch.tensor(MEAN).view(3, 1, 1)
            self.std = self.torch.tensor(STD).view(3, 1, 1)
        self.step_s = dict.fromkeys(STEPS, 0.0)

    def sample(self, jpeg: bytes) -> Any:
        clock = time.perf_counter
        t0 = clock()
        img = self.image.open(io.BytesIO(jpeg)).convert("RGB")  # torchvision's pil_loader
        t1 = clock()
        img = img.crop(random_resized_crop_box(*img.size, self.rng)).resize((CROP, CROP), self.image.Resampling.BILINEAR)
        t2 = clock()
        if self.rng.random() < 0.5:
            img = img.transpose(self.image.Transpose.FLIP_LEFT_RIGHT)
        t3 = clock()
        sample = self._to_normalized(img)
        t4 = clock()
        for step, seconds in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            self.step_s[step] += seconds
        return sample

    def _to_normalized(self, img) -> Any:
        if self.torch is not None:
            raw = self.torch.frombuffer(bytearray(img.tobytes()), dtype=self.torch.uint8)
            tensor = raw.view(CROP, CROP, 3).permute(2, 0, 1).contiguous().float().div_(255)
            return tensor.sub_(self.mean).div_(self.std)
        # Without torch: the same arithmetic on float image bands (x / 255 - mean) / std.
        return [band.convert("F").point(lambda v, m=m, s=s: v * (1 / (255 * s)) + (-m / s))
                for band, m, s in zip(img.split(), MEAN, STD)]

    def describe(self) -> dict[str, Any]:
        return {"tensor": f"torch {self.torch.__version__}" if self.torch is not None else "PIL float bands (no torch)"}


def _import_torch():
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy
    try:
        import torch
    except ImportError:
        return None
    return torch


# -- one worker process ---------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    index: int
    jpegs: tuple[bytes, ...]
    warmup_s: float
    measure_s: float
    use_torch: bool | None
    go_timeout_s: float  # how long to wait for "go" before giving up (the parent died)


def feed_worker(conn: Connection, job: Job) -> None:
    """Worker process: get ready, wait for "go", run the transform for the set time, report.

    Messages to the parent: ("ready", info), ("result", figures), ("error", text)."""
    try:
        pipeline = Pipeline(job.use_torch, seed=job.index)
        pipeline.sample(job.jpegs[0])  # first-call costs before the clock starts
        conn.send(("ready", pipeline.describe()))
        if not conn.poll(job.go_timeout_s):
            return
        go = conn.recv()  # ("go", warm-up s, measure s): what start-up left of the budget
        warmup_s, measure_s = (go[1], go[2]) if isinstance(go, tuple) and len(go) == 3 else (job.warmup_s, job.measure_s)
        conn.send(("result", _timed_loop(pipeline, job.jpegs, warmup_s, measure_s)))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        pass
    except Exception as err:
        try:
            conn.send(("error", f"{type(err).__name__}: {err}"))
        except OSError:
            pass


def _timed_loop(pipeline: Pipeline, jpegs: tuple[bytes, ...], warmup_s: float, measure_s: float) -> dict[str, Any]:
    clock = time.perf_counter
    i, warm_until = 0, clock() + warmup_s
    while clock() < warm_until:
        pipeline.sample(jpegs[i % len(jpegs)])
        i += 1
    pipeline.step_s = dict.fromkeys(STEPS, 0.0)
    count, cpu0, start = 0, time.process_time(), clock()
    end = start + measure_s
    while True:
        pipeline.sample(jpegs[i % len(jpegs)])
        i, count = i + 1, count + 1
        now = clock()
        if now >= end:
            break
    elapsed = now - start
    return {"samples": count, "elapsed_s": elapsed, "cpu_s": time.process_time() - cpu0, "step_s": pipeline.step_s}


# -- the parent side --------------------------------------------------------------------------

class CrewError(Exception):
    """A worker died, hung or failed; the message says which and how."""


class Crew:
    """Worker processes with one pipe each; `stop()` joins or kills every one of them."""

    def __init__(self, target: Callable[[Connection, Job], None], jobs: list[Job]):
        context = _context()
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.pipes: list[Connection] = []
        try:
            for job in jobs:
                ours, theirs = context.Pipe()
                process = context.Process(target=target, args=(theirs, job), daemon=True, name=f"gpuvet-cpufeed-{job.index}")
                # A signal mid-start would cut the pickled job the child is reading: it would
                # print an UnpicklingError traceback of its own. The signal waits for the start.
                with signals_deferred():
                    process.start()
                theirs.close()
                self.processes.append(process)
                self.pipes.append(ours)
        except BaseException:
            self.stop()
            raise

    def gather(self, kind: str, deadline: float, waiting_for: str) -> list[Any]:
        """The payload of one `kind` message from every worker, in worker order."""
        payloads: dict[int, Any] = {}
        while len(payloads) < len(self.pipes):
            pending = [i for i in range(len(self.pipes)) if i not in payloads]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CrewError(f"{len(pending)} of {len(self.pipes)} workers gave no answer within the time limit "
                                f"while {waiting_for} (worker {', '.join(map(str, pending[:8]))}): a hung worker")
            ready = wait([self.pipes[i] for i in pending] + [self.processes[i].sentinel for i in pending], remaining)
            for i in pending:
                if self.pipes[i] in ready or self.pipes[i].poll():
                    payloads[i] = self._receive(i, kind)
                elif self.processes[i].sentinel in ready:
                    raise CrewError(f"worker {i} died while {waiting_for} ({self._exit(i)})")
        return [payloads[i] for i in range(len(self.pipes))]

    def _receive(self, i: int, kind: str) -> Any:
        try:
            message_kind, payload = self.pipes[i].recv()
        except (EOFError, OSError):
            self.processes[i].join(STOP_WAIT_S)
            raise CrewError(f"worker {i} died ({self._exit(i)})") from None
        if message_kind == "error":
            raise CrewError(f"worker {i} failed: {payload}")
        if message_kind != kind:
            raise CrewError(f"worker {i} sent {message_kind!r} where {kind!r} was expected")
        return payload

    def _exit(self, i: int) -> str:
        code = self.processes[i].exitcode
        if code is None:
            return "still running"
        if code >= 0:
            return f"exit code {code}"
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"

    def broadcast(self, message: Any) -> None:
        for i, pipe in enumerate(self.pipes):
            try:
                pipe.send(message)
            except OSError:  # it died after saying it was ready
                self.processes[i].join(STOP_WAIT_S)
                raise CrewError(f"worker {i} died ({self._exit(i)})") from None

    def stop(self) -> None:
        """Join every worker; terminate, then kill, the ones still running."""
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(STOP_WAIT_S)
            if process.is_alive():
                process.kill()
                process.join()
        for pipe in self.pipes:
            pipe.close()

    def __enter__(self) -> Crew:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _context() -> Any:
    """forkserver where there is one: a server process imports torch and Pillow once and forks
    every worker from it, where spawn had each worker import torch itself (on a loaded 2-core
    machine that alone took 10 s of a 6 s budget). Fresh either way: no threads or locks of
    gpuvet's process are inherited."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "PIL.Image", "PIL.JpegImagePlugin"])  # missing ones are skipped
    return context


def warm_up() -> None:
    """Start the worker server now, in the background: it imports torch and Pillow (3 s on a small
    VM, most of a 6 s budget), so started while gpuvet reads the machine's facts it leaves the
    budget to decoding. The first worker's start waits for it (the server's own lock)."""
    if _context().get_start_method() == "forkserver":
        threading.Thread(target=_start_server, name="gpuvet-cpu-feed-server", daemon=True).start()


def _start_server() -> None:
    from multiprocessing import forkserver

    with contextlib.suppress(Exception):  # a server that cannot start now is started by the run itself
        forkserver.ensure_running()


def usable_core_count() -> int:
    """The cores a DataLoader here could use: the affinity set, cut down by a cgroup CPU quota."""
    from ..probe.host import cgroup_cpu_quota, usable_cores

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    try:
        quota = cgroup_cpu_quota()
    except OSError:
        quota = None
    return usable_cores(affinity, quota)


def run(budget_s: float = 10.0, workers: int | None = None, progress: Callable[[str], None] = lambda m: None, *,
        use_torch: bool | None = None, start_timeout_s: float = START_TIMEOUT_S,
        worker: Callable[[Connection, Job], None] = feed_worker) -> list[dict]:
    """Measure `cpu.feed_rate`: samples/s prepared by all workers together.

    budget_s: seconds of decoding (warm-up, then the timed window); starting the workers comes
    on top and is bounded by start_timeout_s. workers: default one per usable core.
    use_torch: None uses torch for the tensor steps when importable, True requires it, False
    avoids it. `worker` is the worker's entry point (tests replace it with broken ones).
    """
    try:
        import PIL
    except ImportError:
        return [_note("skipped", "Pillow is not installed: `pip install Pillow`")]
    count = workers or usable_core_count()
    started = time.monotonic()  # the budget counts from here: making the JPEGs and starting the workers too
    warmup_s, measure_s = _window(budget_s, 0.0)
    try:
        progress("cpu feed: generating test JPEGs")
        jpegs = make_jpegs()
        jobs = [Job(i, jpegs, warmup_s, measure_s, use_torch, go_timeout_s=start_timeout_s + 5.0) for i in range(count)]
        progress(f"cpu feed: starting {count} worker processes")
        with Crew(worker, jobs) as crew:
            infos = crew.gather("ready", time.monotonic() + start_timeout_s, "starting")
            start_s = time.monotonic() - started
            warmup_s, measure_s = _window(budget_s, start_s)
            progress(f"cpu feed: decoding and augmenting on {count} cores for {warmup_s + measure_s:.1f} s")
            crew.broadcast(("go", warmup_s, measure_s))
            results = crew.gather("result", time.monotonic() + warmup_s + measure_s + RESULT_GRACE_S, "measuring")
    except CrewError as err:
        return [_note("failed", str(err))]
    except Exception as err:  # a benchmark must not stop the run
        return [_note("failed", f"{type(err).__name__}: {err}")]
    rate = _feed_rate(results, infos[0], jpegs, warmup_s, measure_s, PIL.__version__)
    rate["details"].update(budget_s=budget_s, start_s=round(start_s, 2))
    return [rate]


def _window(budget_s: float, start_s: float) -> tuple[float, float]:
    """(warm-up s, measure s): what is left of the budget after `start_s` of start-up."""
    left = max(0.0, budget_s - start_s)
    return max(MIN_WARMUP_S, WARMUP_SHARE * left), max(MIN_MEASURE_S, (1 - WARMUP_SHARE) * left)


def _feed_rate(results: list[dict], info: dict, jpegs: tuple[bytes, ...], warmup_s: float, measure_s: float,
               pillow_version: str) -> dict[str, Any]:
    rates = [r["samples"] / r["elapsed_s"] for r in results]
    samples = sum(r["samples"] for r in results)
    steps = {s: sum(r["step_s"][s] for r in results) for s in STEPS}
    step_total = sum(steps.values()) or 1.0
    details = {
        "workers": len(results),
        "per_worker": [round(rate, 1) for rate in rates],
        "samples": samples,
        "measure_s": round(measure_s, 2),
        "warmup_s": round(warmup_s, 2),
        # CPU time a worker got per second of wall time: well under 1 means steal, a CPU quota
        # or other load shared the cores.
        "cpu_share": round(sum(r["cpu_s"] for r in results) / sum(r["elapsed_s"] for r in results), 3),
        # What the same workers would prepare with a core each to themselves (samples per CPU second).
        "uncontended_rate": round(sum(r["samples"] / r["cpu_s"] for r in results if r["cpu_s"] > 0), 1),
        "ms_per_sample": {s: round(1000 * steps[s] / samples, 3) for s in STEPS},
        "step_share": {s: round(steps[s] / step_total, 3) for s in STEPS},
        "image": {"width": IMAGE_WIDTH, "height": IMAGE_HEIGHT, "count": len(jpegs), "quality": JPEG_QUALITY,
                  "jpeg_bytes_mean": round(sum(map(len, jpegs)) / len(jpegs)),
                  "content": "synthetic: gradients, shapes and multi-scale noise, generated at start"},
        "pipeline": ["decode JPEG to RGB (PIL)", f"RandomResizedCrop {CROP} (scale 0.08-1, ratio 3/4-4/3, bilinear)",
                     "RandomHorizontalFlip p=0.5", f"to float CHW /255 ({info.get('tensor')})",
                     "normalize with ImageNet mean/std"],
        "libraries": {"Pillow": pillow_version, "libjpeg": _libjpeg(), "tensor": info.get("tensor")},
        "method": ("one spawned process per worker, as DataLoader(num_workers=N); all start together and run for the same "
                   "window; JPEGs decoded from memory (reading files is the storage benchmark's part)"),
    }
    return {"name": "cpu.feed_rate", "value": sum(rates), "unit": "samples/s", "subject": "cpu", "details": details}


def _libjpeg() -> str | None:
    try:
        from PIL import features

        if features.check_feature("libjpeg_turbo"):
            return f"libjpeg-turbo {features.version_feature('libjpeg_turbo')}"
        version = features.version("jpg")
        return f"libjpeg {version}" if version else None
    except Exception:  # an informative extra, never a reason to fail
        return None


def _note(outcome: str, reason: str) -> dict[str, Any]:
    return {"name": "bench.cpu", "value": None, "unit": "", "subject": "cpu",
            "details": {"outcome": outcome, "reason": reason}}
