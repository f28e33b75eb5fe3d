"""B1: GEMM throughput per dtype, and a check that the products are right.

Method (stas00's mamf-finder, squeezed from half an hour into seconds): `A @ B.T` on random inputs,
the L2 cache flushed (a 256 MiB buffer zeroed) before every timed call, each call timed on its own
(CUDA events), a short scouting pass over candidate shapes, then the best two timed longer. The
value is the best shape's MEDIAN per-call rate, in TFLOPS (2*m*n*k flops per call).

Every long run is also checked, because a GPU that is fast but wrong must fail (gpu-burn's point):
two blocks of the product against a float64 reference computed on the CPU from the same inputs, a
checksum of the whole product (Freivalds), NaN/Inf anywhere, and the last call's output against the
first call's (same inputs, same output on a healthy device).

On the CPU device only fp32 runs (wall clock per call, nothing to flush): the same code, measured
for real, which is what the tests exercise. A CPU is usually a small shared VM, where other
processes and the host's other tenants take the cores for seconds at a time, so there (CPU_METHOD)
a scout that was disturbed (the process held under 90% of its CPUs, or its calls scatter) is timed
again before the finalists are chosen, and the finalists are timed in turns, in blocks, their
figure being the median over the calls of their calm blocks.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch

from .common import (TIMED_CHUNK, BenchContext, Budget, OutOfTime, Skip, device_details, free_memory_bytes, measurement, summary, synchronize,
                     time_each)
from ..specs import reference
from ..samples import quantile

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
# bf16 and fp8 are what training and inference run on, so they get the larger share of the time.
BUDGET_WEIGHT = {"fp32": 1.0, "tf32": 1.0, "fp16": 1.0, "bf16": 2.0, "fp8": 2.0}
# Largest error a healthy device may show, relative to the RMS of the product. Healthy errors, from
# simulations with k up to 16384: fp32 ~1e-6; tf32 ~3e-3 (inputs cut to 10 mantissa bits); fp16
# ~1e-3, ~4e-3 with reduced-precision split-K; bf16 ~1e-2, ~3e-2 with reduced-precision split-K
# (output rounding to 8 bits); fp8 ~0.12 (e4m3 output: 3 mantissa bits round a value by up to 1/16,
# values reach ~4 RMS; the reference uses the same fp8 inputs). A flipped exponent or high mantissa
# bit, or a garbage tile, is far above these.
TOLERANCE = {"fp32": 1e-4, "tf32": 2e-2, "fp16": 2e-2, "bf16": 0.1, "fp8": 0.3}
# A healthy device repeats a product bit for bit (cuBLAS and MKL are deterministic on one stream and
# thread count); the allowance is a margin, a tenth of the accuracy tolerance.
REPEAT_TOLERANCE_FRACTION = 0.1
INPUT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
OUTPUT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}  # fp8 products come out in e4m3, as mamf-finder's

# What the default plan should give this benchmark (all dtypes together).
SUGGESTED_BUDGET_S = {"cpu": 8.0, "cuda": 20.0}

FLUSH_BYTES = 256 * 2**20  # larger than any GPU's L2 (H100 50 MiB, B200 126 MiB)
CHECK_BLOCK = 64  # side of the product blocks compared with the float64 reference
CHUNK_ELEMENTS = 1 << 24  # checks read the product in chunks of this many elements (64 MiB in fp32)
SCOUT_FRACTION = 0.5  # of a dtype's time: the first pass over all candidates (GPU; CPU_METHOD has its own)
FINALISTS = 2  # shapes timed longer after scouting
WARM_UP_FRACTION = 0.2  # of a shape's time, spent on untimed calls
MIN_TIMED_CALLS = 3
MAX_WARM_UP_CALLS = 200
SCOUT_MAX_CALLS = 25
FINAL_MAX_CALLS = 1000
# When a run of calls is too disturbed to rank or report a shape by (CPU only, see CPU_METHOD): the
# process held less than this share of its threads' CPUs while timing (another process, or the
# hypervisor, took them), or the per-call rates scatter (interquartile range over median above this).
CALM_CPU_SHARE = 0.9
NOISY_SPREAD = 0.25


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def as_list(self) -> list[int]:
        return [self.m, self.n, self.k]

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


# GPUs: squares up to where the rate stops growing, plus long-K shapes that keep the tensor cores
# fed with fewer output tiles.
CUDA_SQUARES = tuple(range(2048, 16384 + 1, 2048))
CUDA_LONG_K = (Shape(4096, 4096, 16384), Shape(8192, 8192, 16384))
# The shapes at which mamf-finder measured the best figures gpuvet judges a model against (the spec
# table's mamf_*_shape columns, from stas00 ml-engineering's MAMF tables) are added for that model:
# none of the shapes above is near them, and a figure meant to reach that best needs its shape. They
# are small (0.1-0.4 TFLOP a call), so scouting them costs little of the time.
# CPUs: calls of 10 ms and more. Shorter ones (512^3 takes ~1.5 ms on two cores) are bimodal on a
# shared VM: when a co-tenant preempts one OpenMP thread, every call waits a scheduler slice (~16 ms).
# Past ~768 the rate hardly depends on the shape (two-core AVX2 VM, MKL: every shape from 768^3 to
# 2048x2048x4096 within 3% of the others when timed back to back; long-K ones a little ahead, the
# output tile being written back less often), while calls above ~60 ms only leave fewer calls to
# take a median over: so squares to 1536 and two long-K shapes of 24 and 57 ms.
CPU_SQUARES = (1024, 1536)
CPU_LONG_K = (Shape(768, 768, 3072), Shape(1024, 1024, 4096))
WAVE_TILE = (128, 256)  # a typical cuBLAS output tile on Hopper/Blackwell; only used to propose shapes


def wave_filling_shapes(sm_count: int, k: int = 16384) -> list[Shape]:
    """Outputs whose 128x256 tiles fill exactly one and two waves of the SMs, the most square of each.

    A shape that leaves the last wave part-empty idles SMs; mamf-finder's best H100/H200 shapes are
    of this kind (e.g. 2816x1536 on 132 SMs)."""
    if sm_count < 16:
        return []
    tile_m, tile_n = WAVE_TILE
    shapes = []
    for waves in (1, 2):
        tiles = sm_count * waves
        grids = [(tiles // cols, cols) for cols in range(1, tiles + 1) if tiles % cols == 0]
        rows, cols = min(grids, key=lambda grid: abs(tile_m * grid[0] - tile_n * grid[1]))
        shapes.append(Shape(tile_m * rows, tile_n * cols, k))
    return shapes


def default_candidates(device: str) -> list[Shape]:
    if not device.startswith("cuda"):
        return [Shape(s, s, s) for s in CPU_SQUARES] + list(CPU_LONG_K)
    props = torch.cuda.get_device_properties(device)
    published = [Shape(*shape) for shape in reference.best_shapes(props.name)]
    return [Shape(s, s, s) for s in CUDA_SQUARES] + list(CUDA_LONG_K) + published + wave_filling_shapes(props.multi_processor_count)


@dataclass
class BufferSizes:
    """Elements of the flat buffers a set of shapes needs (each shape uses prefixes of them)."""

    a: int = 0
    b: int = 0
    out: int = 0

    def including(self, shape: Shape) -> BufferSizes:
        return BufferSizes(max(self.a, shape.m * shape.k), max(self.b, shape.n * shape.k), max(self.out, shape.m * shape.n))

    def bytes(self, dtype: str) -> int:
        # The output twice: the product and the first call's copy the check compares it with.
        return (self.a + self.b) * INPUT_BYTES[dtype] + 2 * self.out * OUTPUT_BYTES[dtype]


def fitting_shapes(shapes: list[Shape], dtype: str, memory_limit: int) -> list[Shape]:
    """The shapes, smallest first, as long as all their buffers together fit in `memory_limit` bytes."""
    fitting, sizes = [], BufferSizes()
    for shape in sorted(set(shapes), key=lambda s: (s.flops, s.m, s.n)):
        grown = sizes.including(shape)
        if grown.bytes(dtype) <= memory_limit:
            fitting.append(shape)
            sizes = grown
    return fitting


def parse_shapes(requested: Any) -> list[Shape] | None:
    """params["shapes"]: [[m, n, k], ...] replaces the default candidates (tests, tuning)."""
    if not requested:
        return None
    return [Shape(int(m), int(n), int(k)) for m, n, k in requested]


FP8_MULTIPLE = 16  # torch._scaled_mm (cuBLASLt) refuses a k or n that is not a multiple of this


def shape_unfit_reason(dtype: str, shape: Shape) -> str | None:
    """Why `shape` cannot be multiplied in `dtype` at all, or None. (m is free: only mat1's trailing
    dimension and both of mat2's are checked, "Expected trailing dimension of mat1 to be divisible by 16".)"""
    if dtype == "fp8" and (shape.n % FP8_MULTIPLE or shape.k % FP8_MULTIPLE):
        return f"fp8 (torch._scaled_mm) needs n and k to be multiples of {FP8_MULTIPLE}"
    return None


# ---------------------------------------------------------------- which dtypes run here


def requested_dtypes(params: dict[str, Any]) -> list[str]:
    """params["dtypes"]: a list or a comma-separated string; default all."""
    wanted = params.get("dtypes") or DTYPES
    if isinstance(wanted, str):
        wanted = [name.strip() for name in wanted.split(",") if name.strip()]
    return list(dict.fromkeys(wanted))


def unsupported_reason(device: str, dtype: str) -> str | None:
    """Why `dtype` cannot be measured on `device`, or None if it can."""
    if dtype not in DTYPES:
        return f"unknown GEMM dtype (known: {', '.join(DTYPES)})"
    if not device.startswith("cuda"):
        return None if dtype == "fp32" else "the CPU device is measured in fp32 only"
    major, minor = torch.cuda.get_device_capability(device)
    if dtype in ("tf32", "bf16") and (major, minor) < (8, 0):
        return f"{dtype} needs compute capability 8.0 or newer; this GPU is {major}.{minor}"
    overridden = tf32_override_reason(dtype, (major, minor), os.environ)
    if overridden:
        return overridden
    if dtype == "fp8":
        return fp8_unsupported_reason(device, (major, minor))
    return None


def tf32_override_reason(dtype: str, capability: tuple[int, int], environ: Mapping[str, str]) -> str | None:
    """Why the environment makes `dtype` measure the other fp32 math mode on a CUDA GPU, or None.

    Both variables are read once by the libraries, beneath torch's allow_tf32 setting, so gpuvet
    cannot undo them: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (torch reads exactly "1"; some containers
    and launchers set it for training speed; gpuvet's own worker runs without it) makes cuBLAS run
    fp32 matmuls in TF32, whose error (~1e-3) fails the fp32 check; NVIDIA_TF32_OVERRIDE=0 turns
    TF32 off in every NVIDIA library, so "tf32" is fp32."""
    if dtype == "fp32" and capability >= (8, 0) and environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1":
        return ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 in the environment makes cuBLAS run fp32 matmuls in TF32 "
                "whatever torch's allow_tf32 says, so fp32 would measure TF32 (and fail the fp32 accuracy check); "
                "to measure fp32, run gpuvet with it unset: `env -u TORCH_ALLOW_TF32_CUBLAS_OVERRIDE gpuvet ...`")
    if dtype == "tf32" and environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return ("NVIDIA_TF32_OVERRIDE=0 in the environment turns TF32 off in every NVIDIA library, so tf32 "
                "would measure plain fp32; to measure tf32, run gpuvet with it unset: "
                "`env -u NVIDIA_TF32_OVERRIDE gpuvet ...`")
    return None


# torch._scaled_mm with positional scales returning one tensor (pytorch#128683) is certain from 2.5;
# 2.4 builds let fp8 through with the old API (issue 24), so the bar is 2.5.
SCALED_MM_API = (2, 5)
SCALED_MM_WORDS = "2.5"


def scaled_mm_api_reason(version: str) -> str | None:
    """Why torch `version` cannot run gpuvet's fp8 product, or None (unknown: the probe decides).
    The old torch._scaled_mm took its scales as keywords and returned (out, amax) (pytorch#128683)."""
    parts = version.split("+")[0].split(".")
    try:  # "2.3.1+cu121", "2.4.0a0+07cecf4.nv24.05", "2.10.0.dev20250916+cu130"
        major, minor = int(parts[0]), int(parts[1][: len(parts[1]) - len(parts[1].lstrip("0123456789"))])
    except (ValueError, IndexError):
        return None
    if (major, minor) < SCALED_MM_API:
        return f"torch {version} has the old torch._scaled_mm API: fp8 needs torch >= {SCALED_MM_WORDS}"
    return None


def fp8_unsupported_reason(device: str, capability: tuple[int, int]) -> str | None:
    if capability < (8, 9):
        return f"fp8 needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); this GPU is {capability[0]}.{capability[1]}"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no fp8 matmul (torch._scaled_mm)"
    old_api = scaled_mm_api_reason(torch.__version__)
    if old_api:
        return old_api
    try:  # builds against an old CUDA, or ROCm, lack the e4m3 kernels: try one
        workspace = Workspace.allocate(device, "fp8", BufferSizes(16 * 16, 16 * 16, 16 * 16))
        multiply(workspace.operands(Shape(16, 16, 16)))
        synchronize(device)
    except TypeError as error:  # a 2.4 pre-release from before the API change (e.g. 2.4.0a0 in NGC 24.05)
        return (f"torch {torch.__version__} has the old torch._scaled_mm API ({first_line(error)}): "
                f"fp8 needs torch >= {SCALED_MM_WORDS}")
    except Exception as error:  # whatever breaks the probe means no fp8 GEMM here
        return f"torch._scaled_mm does not run here: {first_line(error)}"
    return None


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def plan_dtypes(device: str, requested: list[str]) -> tuple[list[str], dict[str, str]]:
    """The dtypes to measure, in the standard order, and the others with the reason why not."""
    plan, skipped = [], {}
    for dtype in requested:
        reason = unsupported_reason(device, dtype)
        if reason:
            skipped[dtype] = reason
        else:
            plan.append(dtype)
    plan.sort(key=DTYPES.index)
    return plan, skipped


# ---------------------------------------------------------------- fp32 math mode


def cublas_fp32_setting() -> str | bool:
    """How cuBLAS does fp32 matmuls now, read without tripping torch's check for mixed use of its
    old and new APIs: "ieee", "tf32" or "none" (torch >= 2.9), else the old allow_tf32 flag."""
    try:
        return torch.backends.cuda.matmul.fp32_precision
    except AttributeError:
        return torch.backends.cuda.matmul.allow_tf32


def tf32_enabled() -> bool:
    setting = cublas_fp32_setting()
    if setting == "none":  # inherits the global setting
        setting = getattr(torch.backends, "fp32_precision", "ieee")
    return setting in (True, "tf32")


def set_cublas_tf32(enabled: bool) -> None:
    # The old flag sets torch's old and new fields alike; setting only the new one can leave them
    # disagreeing, and then torch refuses every cuBLAS call.
    torch.backends.cuda.matmul.allow_tf32 = enabled


def restore_cublas_fp32(setting: str | bool) -> None:
    set_cublas_tf32(setting in (True, "tf32"))
    if isinstance(setting, str) and setting not in ("tf32", "ieee"):
        torch.backends.cuda.matmul.fp32_precision = setting


class Fp32MathMode:
    """Whether fp32 matmuls use TF32: a setting global to the process. GEMM jobs of several GPUs
    run in threads side by side, so a thread holds the mode while it measures fp32 or tf32; threads
    wanting the same mode share it, a thread wanting the other one waits. The setting from before
    comes back when the last holder leaves."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._tf32: bool | None = None
        self._holders = 0
        self._saved: str | bool = False

    @contextmanager
    def hold(self, tf32: bool, timeout_s: float) -> Iterator[bool]:
        """Yields False if the other mode was still held after `timeout_s`."""
        with self._changed:
            held = self._changed.wait_for(lambda: self._holders == 0 or self._tf32 == tf32, timeout=max(0.0, timeout_s))
            if held:
                if self._holders == 0:
                    self._saved = cublas_fp32_setting()
                    set_cublas_tf32(tf32)
                    self._tf32 = tf32
                self._holders += 1
        if not held:
            yield False
            return
        try:
            yield True
        finally:
            with self._changed:
                self._holders -= 1
                if self._holders == 0:
                    restore_cublas_fp32(self._saved)
                    self._tf32 = None
                    self._changed.notify_all()


FP32_MATH = Fp32MathMode()


@contextmanager
def math_mode(dtype: str, timeout_s: float) -> Iterator[bool]:
    if dtype not in ("fp32", "tf32"):
        yield True
        return
    with FP32_MATH.hold(dtype == "tf32", timeout_s) as held:
        yield held


# ---------------------------------------------------------------- operands and the product


@dataclass
class Operands:
    """One product: out = a @ b.T (b.T is column-major, as cuBLAS and torch._scaled_mm want it)."""

    dtype: str
    a: torch.Tensor  # (m, k), row-major
    b: torch.Tensor  # (n, k), row-major
    out: torch.Tensor  # (m, n)
    first_out: torch.Tensor  # (m, n): the first call's product, for the repeat check
    scale: torch.Tensor | None  # fp8: the tensor-wise scale of a and of b (float32, 1.0)


# fp8 products accumulate in full fp32 (torch's default), as mamf-finder measured the best fp8 figures
# gpuvet judges against (its _scaled_mm call leaves use_fast_accum at False). Hopper's fast
# accumulation is 10-20% faster (pytorch/ao#2377) and less accurate; SuperBench's cuBLASLt fp8 GEMM
# uses it, so its fp8 figures are not comparable with these.
FP8_FAST_ACCUM = False


def multiply(ops: Operands) -> None:
    """ops.out = ops.a @ ops.b.T in the dtype's arithmetic. (The tests replace it to corrupt products.)"""
    if ops.scale is not None:  # fp8: the only dtype whose products carry a scale
        torch._scaled_mm(ops.a, ops.b.t(), ops.scale, ops.scale, out_dtype=torch.float8_e4m3fn,
                         use_fast_accum=FP8_FAST_ACCUM, out=ops.out)
    else:
        torch.mm(ops.a, ops.b.t(), out=ops.out)


TORCH_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Workspace:
    """Flat random buffers for one dtype, sized for its largest shape. Every shape multiplies
    contiguous prefixes of them, so a sweep allocates once: no allocator churn between shapes, and
    nothing that would make the threads of other GPUs wait on a cudaFree."""

    dtype: str
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    first_out: torch.Tensor
    scale: torch.Tensor | None

    @classmethod
    def allocate(cls, device: str, dtype: str, sizes: BufferSizes, seed: int = 0) -> Workspace:
        generator = torch.Generator(device=device).manual_seed(seed)
        input_dtype = torch.float8_e4m3fn if dtype == "fp8" else TORCH_DTYPE[dtype]
        output_dtype = torch.float8_e4m3fn if dtype == "fp8" else TORCH_DTYPE[dtype]
        a = fill_random(torch.empty(sizes.a, dtype=input_dtype, device=device), generator)
        b = fill_random(torch.empty(sizes.b, dtype=input_dtype, device=device), generator)
        out = torch.empty(sizes.out, dtype=output_dtype, device=device)
        first_out = torch.empty_like(out)
        scale = torch.ones((), dtype=torch.float32, device=device) if dtype == "fp8" else None
        return cls(dtype, a, b, out, first_out, scale)

    def scale_for(self, k: int) -> torch.Tensor | None:
        """fp8: k^-1/4 on each operand, so a product of k standard normal pairs stays near 1, well
        inside e4m3's range (448), whatever the shape."""
        return None if self.scale is None else torch.full_like(self.scale, k ** -0.25)

    def operands(self, shape: Shape) -> Operands:
        m, n, k = shape.m, shape.n, shape.k
        return Operands(self.dtype, self.a[: m * k].view(m, k), self.b[: n * k].view(n, k),
                        self.out[: m * n].view(m, n), self.first_out[: m * n].view(m, n), self.scale_for(k))


def fill_random(buffer: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Standard normal values (fp8: drawn in bf16, converted chunk by chunk to bound the memory)."""
    if buffer.dtype.itemsize > 1:
        return buffer.normal_(generator=generator)
    for start in range(0, buffer.numel(), CHUNK_ELEMENTS):
        chunk = buffer[start : start + CHUNK_ELEMENTS]
        chunk.copy_(torch.randn(chunk.numel(), dtype=torch.bfloat16, device=buffer.device, generator=generator))
    return buffer


# ---------------------------------------------------------------- the check


def row_chunks(rows: int, columns: int) -> Iterator[slice]:
    """Slices of `rows` rows of about CHUNK_ELEMENTS elements each, for checks that bound their memory."""
    step = max(1, CHUNK_ELEMENTS // max(1, columns))
    for start in range(0, rows, step):
        yield slice(start, start + step)


def worse(a: float, b: float) -> float:
    """max() that keeps NaN: an error that is not a number is the worst error."""
    return b if math.isnan(b) or b > a else a


def to_cpu_float64(t: torch.Tensor) -> torch.Tensor:
    # float32 holds every fp8/fp16/bf16/fp32 value exactly, and every device converts to it.
    return t.to(torch.float32).cpu().to(torch.float64)


def scale_factor(ops: Operands) -> float:
    return float(ops.scale) ** 2 if ops.scale is not None else 1.0


def reference_block_error(ops: Operands) -> tuple[float, float]:
    """(RMS of the product, largest error relative to it) over two corner blocks of the product,
    against float64 from the same inputs."""
    m, n = ops.out.shape
    size = min(CHECK_BLOCK, m, n)
    sum_squares, count, worst = 0.0, 0, 0.0
    for rows, cols in ((slice(0, size), slice(0, size)), (slice(m - size, m), slice(n - size, n))):
        want = to_cpu_float64(ops.a[rows]) @ to_cpu_float64(ops.b[cols]).T * scale_factor(ops)
        got = to_cpu_float64(ops.out[rows, cols])
        sum_squares += float(want.square().sum())
        count += want.numel()
        worst = worse(worst, float((got - want).abs().max()))
    rms = math.sqrt(sum_squares / count) or 1.0
    return rms, worst / rms


def checksum_error(ops: Operands, rms: float) -> float:
    """Freivalds: out @ x against a @ (b.T @ x) for a random +-1 vector x. Covers every element of
    the product at the cost of three reads; relative to rms * sqrt(n), the size of the sum, so a
    healthy device's rounding gives about the same figure as the block check."""
    m, n = ops.out.shape
    generator = torch.Generator(device=ops.out.device).manual_seed(1)
    x = torch.randint(0, 2, (n,), device=ops.out.device, generator=generator).to(torch.float32) * 2 - 1
    b_t_x = torch.zeros(ops.a.shape[1], dtype=torch.float32, device=ops.out.device)
    for rows in row_chunks(n, ops.b.shape[1]):
        b_t_x += ops.b[rows].to(torch.float32).t() @ x[rows]
    b_t_x *= scale_factor(ops)
    worst = 0.0
    for rows in row_chunks(m, max(n, ops.a.shape[1])):
        want = ops.a[rows].to(torch.float32) @ b_t_x
        got = ops.out[rows].to(torch.float32) @ x
        worst = worse(worst, float((got - want).abs().max()))
    return worst / (rms * math.sqrt(n))


def repeat_error(out: torch.Tensor, first_out: torch.Tensor, rms: float) -> float:
    """Largest difference between the last and the first product of the same inputs, relative to rms."""
    worst = 0.0
    for rows in row_chunks(*out.shape):
        worst = worse(worst, float((out[rows].to(torch.float32) - first_out[rows].to(torch.float32)).abs().max()))
    return worst / rms


def has_nan_or_inf(out: torch.Tensor) -> bool:
    # float8 has no isfinite kernel: its values are checked as float32, which holds them all.
    return any(not bool(torch.isfinite(out[rows].to(torch.float32)).all()) for rows in row_chunks(*out.shape))


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None  # the record is JSON: no NaN there


def check_product(ops: Operands, tolerance: float) -> dict[str, Any]:
    """Is ops.out right? ops.first_out must hold the first product of the same inputs."""
    rms, block = reference_block_error(ops)
    checksum = checksum_error(ops, rms)
    repeat = repeat_error(ops.out, ops.first_out, rms)
    repeat_tolerance = tolerance * REPEAT_TOLERANCE_FRACTION
    nan_or_inf = has_nan_or_inf(ops.out)
    repeat_mismatch = not repeat <= repeat_tolerance  # NaN counts as a mismatch
    ok = not nan_or_inf and block <= tolerance and checksum <= tolerance and not repeat_mismatch
    return {"ok": ok, "max_error": finite_or_none(block), "tolerance": tolerance, "nan_or_inf": nan_or_inf,
            "repeat_mismatch": repeat_mismatch, "repeat_error": finite_or_none(repeat),
            "repeat_tolerance": repeat_tolerance, "checksum_error": finite_or_none(checksum)}


def merge_checks(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """One verdict over several checked runs: the worst of each figure (None, not finite, is worst)."""

    def worst(key: str) -> float | None:
        values = [c[key] for c in checks]
        return None if None in values else max(values)

    merged = dict(checks[0])
    merged.update(ok=all(c["ok"] for c in checks), nan_or_inf=any(c["nan_or_inf"] for c in checks),
                  repeat_mismatch=any(c["repeat_mismatch"] for c in checks), runs_checked=len(checks))
    for key in ("max_error", "repeat_error", "checksum_error"):
        merged[key] = worst(key)
    return merged


# ---------------------------------------------------------------- timing


@dataclass(frozen=True)
class Method:
    """How a dtype's time is spent. GPUs (GPU_METHOD): half of it scouting every candidate once, then
    the best FINALISTS timed longer, one after the other, each once. CPUs (CPU_METHOD) measure on
    shared two-core VMs, where another process or a co-tenant of the host takes the cores for a
    second or more at a time: a noisy scout is timed again before the finalists are chosen, and the
    finalists are timed in turns, in blocks, so that a burst of load costs a block, not the result."""

    scout_fraction: float = SCOUT_FRACTION  # of the dtype's time, for the first pass over the candidates
    scout_max_calls: int = SCOUT_MAX_CALLS
    retime_fraction: float = 0.0  # of the scouting time, kept to time noisy scouts again
    final_block_s: float | None = None  # finalists timed in turns of blocks this long; None: once each
    block_warm_up_fraction: float = WARM_UP_FRACTION  # of a block, untimed (the shape is warm from scouting)


GPU_METHOD = Method()
# A CPU's rate hardly depends on the shape once calls last ~10 ms (every candidate is within a few
# percent), so scouting gets a third of the time and the finalists, where the figure comes from,
# two thirds; blocks of ~0.7 s hold 15-50 calls of the CPU candidates.
CPU_METHOD = Method(scout_fraction=0.35, scout_max_calls=40, retime_fraction=0.25, final_block_s=0.7,
                    block_warm_up_fraction=0.1)


def method_for(device: str) -> Method:
    return GPU_METHOD if device.startswith("cuda") else CPU_METHOD


def relative_iqr(values: list[float]) -> float:
    """Interquartile range over median: how far a run's calls scatter (0 for fewer than four calls)."""
    if len(values) < 4:
        return 0.0
    q1, median, q3 = (quantile(values, q) for q in (0.25, 0.5, 0.75))  # the one quantile (samples.py)
    return (q3 - q1) / median if median > 0 else math.inf


@dataclass
class ShapeRun:
    shape: Shape
    seconds: list[float]  # one per timed call
    check: dict[str, Any] | None = None
    # CPU: CPU seconds the process used over wall seconds times its threads, while timing (about 1
    # when nothing else ran); None on a GPU.
    cpu_share: float | None = None
    blocks: int = 1  # timed runs pooled into this one (finalists on a CPU)
    calm_blocks: int = 1  # of which not noisy (0: all were, and all are pooled)
    retimed: bool = False  # a noisy scout timed again

    @property
    def tflops(self) -> list[float]:
        return [self.shape.flops / t / 1e12 for t in self.seconds if t > 0]

    @property
    def median_tflops(self) -> float:
        rates = self.tflops
        return statistics.median(rates) if rates else 0.0

    @property
    def spread(self) -> float:
        return relative_iqr(self.tflops)

    @property
    def noisy(self) -> bool:
        """Too disturbed to trust: the CPUs were taken while timing, or the calls scatter."""
        return (self.cpu_share is not None and self.cpu_share < CALM_CPU_SHARE) or self.spread > NOISY_SPREAD


def cache_flush(device: str) -> Callable[[], Any] | None:
    """What to run before each timed call so it starts with a cold L2: zeroing a 256 MiB buffer
    (the bound method keeps the buffer alive). The CPU flushes nothing."""
    if not device.startswith("cuda"):
        return None
    return torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device).zero_


def warm_up(device: str, call: Callable[[], Any], flush: Callable[[], Any] | None, seconds: float) -> float:
    """Untimed calls, doubling their number until `seconds` have passed; wall seconds per call (flush included)."""
    done, batch, start = 0, 1, time.perf_counter()
    while True:
        for _ in range(batch):
            if flush is not None:
                flush()
            call()
        done += batch
        synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds or done >= MAX_WARM_UP_CALLS:
            return elapsed / done
        batch = done


class CpuShare:
    """Times the process's CPU use against the wall clock (CPU device only)."""

    def __init__(self, device: str) -> None:
        self.threads = 0 if device.startswith("cuda") else max(1, torch.get_num_threads())
        self.cpu, self.wall = time.process_time(), time.perf_counter()

    def share(self) -> float | None:
        wall = time.perf_counter() - self.wall
        if not self.threads or wall <= 0:
            return None
        return (time.process_time() - self.cpu) / (wall * self.threads)


def run_shape(device: str, workspace: Workspace, shape: Shape, seconds: float, flush: Callable[[], Any] | None,
              *, max_calls: int, check: bool, warm_up_fraction: float = WARM_UP_FRACTION) -> ShapeRun:
    """Times calls of one shape for about `seconds` (at least a few calls, whatever the time)."""
    deadline = time.monotonic() + seconds
    ops = workspace.operands(shape)

    def call() -> None:
        multiply(ops)  # looked up at every call, so a test can swap it

    call()  # the library picks and loads its kernel, the CPU's threads wake up: not timed
    synchronize(device)
    if check:
        ops.first_out.copy_(ops.out)
    per_call = warm_up(device, call, flush, seconds * warm_up_fraction)
    calls = int((deadline - time.monotonic()) / per_call) if per_call > 0 else max_calls
    share = CpuShare(device)
    times = time_each(device, call, max(MIN_TIMED_CALLS, min(max_calls, calls)), before=flush)
    result = ShapeRun(shape, times, cpu_share=share.share())
    if check:  # ops.out now holds the last timed call's product
        result.check = check_product(ops, TOLERANCE[workspace.dtype])
    return result


# ---------------------------------------------------------------- the sweep of one dtype


@dataclass
class DtypeResult:
    dtype: str
    device: str
    scouted: list[ShapeRun]
    confirmed: list[ShapeRun]  # the finalists, timed longer and checked
    not_tried: list[Shape] = field(default_factory=list)  # the time ran out before them
    wall_s: float = 0.0
    left_out: dict[Shape, str] = field(default_factory=dict)  # candidates this dtype could not take, and why
    not_timed: dict[Shape, str] = field(default_factory=dict)  # finalists the time left could not time again, and why

    @property
    def best(self) -> ShapeRun:
        return max(self.confirmed, key=lambda run: run.median_tflops)

    @property
    def check(self) -> dict[str, Any]:
        return merge_checks([run.check for run in self.confirmed if run.check is not None])


FEWEST_CALLS = 2 + MIN_TIMED_CALLS  # of any run of a shape: the first, one warm-up, the timed ones


def too_slow(shape: Shape, best_flops_per_s: float, seconds_left: float) -> bool:
    """Whether the fewest calls a shape needs (first, warm-up, timed) would overrun the time left,
    at the best rate seen so far (larger shapes usually run faster, so this errs on trying), or at
    the shape's own rate. False while no rate is known."""
    if best_flops_per_s <= 0:
        return False
    return FEWEST_CALLS * shape.flops / best_flops_per_s > seconds_left


def scout(device: str, workspace: Workspace, candidates: list[Shape], budget: Budget, flush: Callable[[], Any] | None,
          progress: Callable[[str], None], method: Method = GPU_METHOD) -> tuple[list[ShapeRun], list[Shape]]:
    """A brief run of each candidate, smallest first, each with an even share of the time left; the
    rest are left out once the time is spent or the next shape could not fit in it. Always runs at
    least the first. With method.retime_fraction, that share of the time is kept to time noisy
    scouts again."""
    first_pass = budget.share(1.0 - method.retime_fraction) if method.retime_fraction else budget
    runs: list[ShapeRun] = []
    best_rate = 0.0
    for index, shape in enumerate(candidates):
        if runs and (first_pass.expired() or too_slow(shape, best_rate, first_pass.remaining())):
            if method.retime_fraction:
                retime_noisy(device, workspace, runs, budget, flush, progress, method)
            return runs, candidates[index:]
        seconds = max(0.0, first_pass.remaining() / (len(candidates) - index))
        # The first scout is checked: on a device too slow for its budget it is the only run there
        # is time for, and then its figure is the dtype's (see measure_dtype).
        run = run_shape(device, workspace, shape, seconds, flush, max_calls=method.scout_max_calls, check=not runs)
        runs.append(run)
        best_rate = max(best_rate, run.median_tflops * 1e12)
        progress(f"gemm.{workspace.dtype} {shape}: {run.median_tflops:.4g} TFLOPS" + noise_words(run))
    if method.retime_fraction:
        retime_noisy(device, workspace, runs, budget, flush, progress, method)
    return runs, []


def noise_words(run: ShapeRun) -> str:
    words = [f"spread {100 * run.spread:.0f}%"]
    if run.cpu_share is not None:
        words.append(f"CPU share {run.cpu_share:.2f}")
    return f" ({', '.join(words)}{', noisy' if run.noisy else ''})"


def retime_noisy(device: str, workspace: Workspace, runs: list[ShapeRun], budget: Budget,
                 flush: Callable[[], Any] | None, progress: Callable[[str], None], method: Method) -> None:
    """Times each noisy scout once more, the fastest first, with an even share of what is left of
    `budget`, and keeps the steadier of its two runs: a scout the load from elsewhere slowed down
    must not lose its place among the finalists, nor one that a few lucky calls sped up win it."""
    noisy = sorted((index for index, run in enumerate(runs) if run.noisy), key=lambda i: runs[i].median_tflops, reverse=True)
    best_rate = max(run.median_tflops for run in runs) * 1e12
    for order, index in enumerate(noisy):
        seconds = budget.remaining() / (len(noisy) - order)
        if seconds <= 0 or too_slow(runs[index].shape, best_rate, seconds):
            continue
        again = run_shape(device, workspace, runs[index].shape, seconds, flush, max_calls=method.scout_max_calls, check=False)
        check = runs[index].check
        runs[index] = steadier(runs[index], again)
        runs[index].check = runs[index].check or check  # the shape's product was checked either way
        runs[index].retimed = True
        progress(f"gemm.{workspace.dtype} {again.shape} again: {again.median_tflops:.4g} TFLOPS" + noise_words(again))


def steadier(first: ShapeRun, second: ShapeRun) -> ShapeRun:
    """The run to rank a shape by: a calm one over a noisy one, else the faster."""
    return max((second, first), key=lambda run: (not run.noisy, run.median_tflops))


def finalists(scouted: list[ShapeRun], count: int = FINALISTS) -> list[Shape]:
    """The shapes with the best median rates while scouting, best first."""
    ranked = sorted(scouted, key=lambda run: run.median_tflops, reverse=True)
    return [run.shape for run in ranked[:count]]


NO_TIME_TO_CONFIRM = f"its fewest calls ({FEWEST_CALLS}) at its scouting rate would overrun the time left"


def out_of_time(shape: Shape, rates: Mapping[Shape, float], budget: Budget) -> bool:
    """Whether a finalist's next run would overrun the time left (at its scouting rate)."""
    return budget.expired() or too_slow(shape, rates.get(shape, 0.0), budget.remaining())


def confirm(device: str, workspace: Workspace, shapes: list[Shape], budget: Budget, flush: Callable[[], Any] | None,
            progress: Callable[[str], None], rates: Mapping[Shape, float],
            not_timed: dict[Shape, str]) -> list[ShapeRun]:
    """The finalists timed with the rest of the time, and checked. Always runs at least the first;
    a later one whose fewest calls would overrun the time left is put in `not_timed`."""
    runs: list[ShapeRun] = []
    for index, shape in enumerate(shapes):
        seconds = budget.remaining() / (len(shapes) - index)
        if runs and out_of_time(shape, rates, budget):
            not_timed[shape] = NO_TIME_TO_CONFIRM
            continue
        run = run_shape(device, workspace, shape, max(0.0, seconds), flush, max_calls=FINAL_MAX_CALLS, check=True)
        runs.append(run)
        progress(f"gemm.{workspace.dtype} {shape}: {run.median_tflops:.4g} TFLOPS over {len(run.seconds)} calls")
    return runs


def confirm_in_turns(device: str, workspace: Workspace, shapes: list[Shape], budget: Budget,
                     flush: Callable[[], Any] | None, progress: Callable[[str], None], method: Method,
                     rates: Mapping[Shape, float], not_timed: dict[Shape, str]) -> list[ShapeRun]:
    """The finalists timed with the rest of the time in turns (A, B, A, B, ...), in blocks of about
    method.final_block_s, every block checked. A shape's figure is the median over the calls of its
    calm blocks (all its blocks if none was calm): a block during which another process took the
    CPUs, or whose calls scatter, is timed again by the next turn rather than trusted, and the
    finalists are compared under the same conditions. Always runs at least the first block; a later
    block whose fewest calls would overrun the time left is not run (a finalist left with no block
    is put in `not_timed`)."""
    block_s = method.final_block_s or budget.remaining()
    turns = max(1, round(budget.remaining() / (block_s * max(1, len(shapes)))))
    order = [shape for _ in range(turns) for shape in shapes]
    blocks: dict[Shape, list[ShapeRun]] = {shape: [] for shape in shapes}
    for index, shape in enumerate(order):
        seconds = budget.remaining() / (len(order) - index)
        if index and out_of_time(shape, rates, budget):
            continue
        blocks[shape].append(run_shape(device, workspace, shape, max(0.0, seconds), flush, max_calls=FINAL_MAX_CALLS,
                                       check=True, warm_up_fraction=method.block_warm_up_fraction))
    runs = [pooled(shape, shape_blocks) for shape, shape_blocks in blocks.items() if shape_blocks]
    not_timed.update({shape: NO_TIME_TO_CONFIRM for shape, shape_blocks in blocks.items()
                      if not shape_blocks})
    for run in runs:
        progress(f"gemm.{workspace.dtype} {run.shape}: {run.median_tflops:.4g} TFLOPS over {len(run.seconds)} calls "
                 f"in {run.calm_blocks} calm of {run.blocks} blocks")
    return runs


def pooled(shape: Shape, blocks: list[ShapeRun]) -> ShapeRun:
    """One run from a shape's blocks: the calls of its calm blocks (of all, if none was calm), every block's check."""
    calm = [block for block in blocks if not block.noisy]
    kept = calm or blocks
    shares = [block.cpu_share for block in kept if block.cpu_share is not None]
    checks = [block.check for block in blocks if block.check is not None]
    return ShapeRun(shape, [t for block in kept for t in block.seconds], merge_checks(checks) if checks else None,
                    cpu_share=statistics.fmean(shares) if shares else None, blocks=len(blocks), calm_blocks=len(calm))


def measure_dtype(device: str, dtype: str, budget: Budget, candidates: list[Shape],
                  flush: Callable[[], Any] | None = None, progress: Callable[[str], None] = lambda message: None) -> DtypeResult:
    """Scout the candidates (they must fit in memory), time the best ones longer, check them."""
    start = time.monotonic()
    method = method_for(device)
    sizes = BufferSizes()
    for shape in candidates:
        sizes = sizes.including(shape)
    workspace = Workspace.allocate(device, dtype, sizes)
    try:
        scouted, not_tried = scout(device, workspace, candidates, budget.share(method.scout_fraction), flush, progress, method)
        shapes = finalists(scouted)
        rates = {run.shape: run.median_tflops * 1e12 for run in scouted}
        not_timed: dict[Shape, str] = {}
        best_scout = max(scouted, key=lambda run: run.median_tflops)
        if best_scout.check is not None and out_of_time(best_scout.shape, rates, budget):
            # A device too slow for its budget: the first scout took the time, and timing the best
            # shape again would overrun it. Its scouting run, checked, is the figure.
            confirmed = [best_scout]
            not_timed.update({shape: NO_TIME_TO_CONFIRM for shape in shapes})
            progress(f"gemm.{dtype} {best_scout.shape}: no time left to time it again; its scouting run is the figure")
        elif method.final_block_s:
            confirmed = confirm_in_turns(device, workspace, shapes, budget, flush, progress, method, rates, not_timed)
        else:
            confirmed = confirm(device, workspace, shapes, budget, flush, progress, rates, not_timed)
    finally:
        del workspace
    return DtypeResult(dtype, device, scouted, confirmed, not_tried, time.monotonic() - start, not_timed=not_timed)


# ---------------------------------------------------------------- the benchmark


def run(ctx: BenchContext) -> list[dict]:
    with torch.cuda.device(ctx.device) if ctx.is_cuda else nullcontext():
        plan, skipped = plan_dtypes(ctx.device, requested_dtypes(ctx.params))
        if not plan:
            raise Skip(f"no GEMM dtype to measure on {ctx.device}: " + "; ".join(f"{d}: {why}" for d, why in skipped.items()))
        if ctx.budget.expired():
            raise OutOfTime("no time left to measure GEMM")
        flush_bytes = FLUSH_BYTES if ctx.is_cuda else 0
        memory_limit = free_memory_bytes(ctx.device) // 4 - flush_bytes  # never more than a quarter of free memory
        candidates = parse_shapes(ctx.params.get("shapes")) or default_candidates(ctx.device)
        results: list[DtypeResult] = []
        errors: dict[str, str] = {}
        flush = cache_flush(ctx.device)
        try:
            for index, dtype in enumerate(plan):
                result = measure_in_turn(ctx, dtype, plan[index:], candidates, memory_limit, flush, skipped, errors)
                if result is not None:
                    results.append(result)
        finally:
            # No torch.cuda.empty_cache() here: it empties the caches of every GPU of the process, and its
            # cudaFree waits for each GPU's queued work, so this GPU's thread would stall behind the GEMMs
            # of the others. The blocks stay cached for the worker's next job on this GPU to reuse, and the
            # allocator frees this GPU's cache alone if an allocation there needs the room.
            del flush
    if not results:
        reasons = "; ".join(f"{d}: {errors.get(d) or skipped[d]}" for d in plan)
        if errors:  # a failing GEMM is a finding, not a dtype that does not apply here
            raise RuntimeError(f"no GEMM could be measured on {ctx.device}: {reasons}")
        if ctx.budget.expired():
            raise OutOfTime(f"the time budget ran out before any GEMM was measured ({reasons})")
        raise Skip(f"no GEMM could be measured on {ctx.device}: {reasons}")
    return ([dtype_measurement(result, ctx.subject, skipped, errors) for result in results]
            + [check_failures(results, ctx.subject, errors)])


def measure_in_turn(ctx: BenchContext, dtype: str, dtypes_left: list[str], candidates: list[Shape], memory_limit: int,
                    flush: Callable[[], Any] | None, skipped: dict[str, str], errors: dict[str, str]) -> DtypeResult | None:
    """One dtype with its share of what is left of the time; None if it cannot run (the reason in
    `skipped`) or failed (the error in `errors`: the other dtypes keep their results)."""
    left_out = {shape: why for shape in candidates if (why := shape_unfit_reason(dtype, shape))}
    usable = [shape for shape in candidates if shape not in left_out]
    if not usable:
        skipped[dtype] = f"no candidate shape suits it: {'; '.join(sorted(set(left_out.values())))}"
        return None
    shapes = fitting_shapes(usable, dtype, memory_limit)
    if not shapes:
        skipped[dtype] = f"no candidate shape fits in a quarter of free memory ({memory_limit / 2**30:.1f} GiB)"
        return None
    memory_words = f"does not fit in a quarter of free memory ({memory_limit / 2**30:.1f} GiB) with the smaller shapes"
    left_out.update({shape: memory_words for shape in usable if shape not in shapes})
    with math_mode(dtype, ctx.budget.remaining()) as held:
        if not held:
            skipped[dtype] = "the time ran out waiting for other GPUs to finish with the other fp32 math mode"
            return None
        weights_left = sum(BUDGET_WEIGHT[d] for d in dtypes_left)
        budget = ctx.budget.share(BUDGET_WEIGHT[dtype] / weights_left)
        if budget.expired():
            skipped[dtype] = "the time budget was spent before its turn"
            return None
        try:
            result = measure_dtype(ctx.device, dtype, budget, shapes, flush, ctx.progress)
        except torch.cuda.OutOfMemoryError as error:  # someone else took the memory meanwhile
            skipped[dtype] = f"out of memory: {first_line(error)}"
            return None
        except RuntimeError as error:  # a library refusing a shape, or a CUDA error: this dtype's finding
            errors[dtype] = f"{type(error).__name__}: {first_line(error)}"
            ctx.progress(f"gemm.{dtype} failed: {errors[dtype]}")
            return None
    result.left_out = {shape: left_out[shape] for shape in candidates if shape in left_out}
    return result


def timing_words(device: str) -> str:
    if device.startswith("cuda"):
        return ("CUDA events around each call; the L2 cache flushed (256 MiB zeroed) before each; calls queued "
                f"{TIMED_CHUNK} at a time behind a GPU-side wait (torch.cuda._sleep), so host delays are not timed")
    return "wall clock around each call (synchronised); nothing flushed"


def dtype_measurement(result: DtypeResult, subject: str, skipped: dict[str, str],
                      errors: dict[str, str] | None = None) -> dict[str, Any]:
    best = result.best
    rates = best.tflops
    not_tried = {shape: "not reached in the time (or it would have overrun it)" for shape in result.not_tried}
    not_tried.update(result.left_out)
    extra: dict[str, Any] = {"failed_dtypes": dict(errors)} if errors else {}
    if result.dtype == "fp8":
        extra["accumulation"] = f"fp32 (torch._scaled_mm use_fast_accum={FP8_FAST_ACCUM}, as mamf-finder)"
    return measurement(
        f"gemm.{result.dtype}", statistics.median(rates), "TFLOPS", subject,
        dtype=result.dtype,
        shape=best.shape.as_list(),
        iterations=len(rates),
        summary=summary(rates),
        shapes_tried=[[*run.shape.as_list(), run.median_tflops] for run in result.scouted],
        finalists=[[*run.shape.as_list(), run.median_tflops] for run in result.confirmed],
        shapes_not_tried=[shape.as_list() for shape in not_tried],
        shapes_not_tried_why={str(shape): why for shape, why in not_tried.items()},
        # Finalists the time left could not time again (a device too slow for the budget); where the
        # best is among them, its checked scouting run is the figure.
        finalists_not_timed={str(shape): why for shape, why in result.not_timed.items()},
        check=result.check,
        skipped_dtypes=dict(skipped),
        timing=timing_words(result.device),
        method="A @ B.T on normal random inputs (fp8: torch._scaled_mm, e4m3 inputs and e4m3 output as mamf-finder, "
               "scales k^-1/4, "
               f"use_fast_accum={FP8_FAST_ACCUM}); value = median of the per-call rates of the best shape"
               + method_words(result.device),
        wall_s=result.wall_s,
        **noise_details(result),
        **device_details(result.device),
        **extra,
    )


def method_words(device: str) -> str:
    if device.startswith("cuda"):
        return ""
    return (" over its calm blocks (finalists timed in turns, in blocks; a block during which the process held "
            f"less than {CALM_CPU_SHARE:g} of its CPUs, or whose calls scatter by more than {100 * NOISY_SPREAD:g}% "
            "(interquartile range), is set aside; noisy scouts are timed again)")


def noise_details(result: DtypeResult) -> dict[str, Any]:
    """How disturbed the figure's calls were: their scatter and, on the CPU, the share of the CPUs
    the process held, and how many of the best shape's blocks were calm."""
    best = result.best
    details: dict[str, Any] = {"spread_iqr_pct": 100 * best.spread}
    if best.cpu_share is not None:
        details.update(cpu_share=best.cpu_share, blocks=best.blocks, calm_blocks=best.calm_blocks,
                       shapes_retimed=[run.shape.as_list() for run in result.scouted if run.retimed])
    return details


def check_failures(results: list[DtypeResult], subject: str, errors: dict[str, str] | None = None) -> dict[str, Any]:
    failed = [result.dtype for result in results if not result.check["ok"]]
    return measurement(
        "gemm.check_failures", len(failed), "count", subject,
        failed=failed,
        checked=[result.dtype for result in results],
        checks={result.dtype: result.check for result in results},
        errors=dict(errors or {}),  # dtypes whose GEMM raised instead of giving a product to check
        method="two 64x64 blocks against a float64 CPU reference, a Freivalds checksum of the whole product, "
               "NaN/Inf, and the last call against the first",
    )
