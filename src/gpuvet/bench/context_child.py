"""A CUDA context created in a fresh child process, timed: the child is a stdlib-only script
that loads libcuda with ctypes (no PyTorch), so the parent of a run (which never imports torch)
can measure the first process on an idle GPU before any gpuvet process holds a context there,
and the benchmark worker can measure the later ones."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from .common import Skip

LIBCUDA = "libcuda.so.1"
CHILD_TIMEOUT_S = 30.0
CONTEXT_INIT_WHAT = ("milliseconds from just before cuInit(0) to a current, synchronised primary context "
                     "(cuDevicePrimaryCtxRetain + cuCtxSetCurrent + cuCtxSynchronize), in a fresh Python "
                     "process that loads libcuda with ctypes and imports no PyTorch")

# The child: stdlib only. It prints one JSON line: the timings, or the failing call and its error.
CHILD_SCRIPT = r"""
import ctypes, json, sys, time

def say(**fields):
    print(json.dumps(fields), flush=True)
    sys.exit(0)

ordinal, libname = int(sys.argv[1]), sys.argv[2]
t_load = time.perf_counter()
try:
    cuda = ctypes.CDLL(libname)
except OSError as err:
    say(ok=False, no_driver=True, error=f"no CUDA driver ({libname} not found: {err})")
t_loaded = time.perf_counter()

def error_name(code):
    name = ctypes.c_char_p()
    try:
        if cuda.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
    except AttributeError:
        pass
    return "CUresult"

def call(fn, *args):
    code = getattr(cuda, fn)(*args)
    if code != 0:
        say(ok=False, call=fn, code=code, error=f"{fn} failed: {error_name(code)} ({code})")

release = getattr(cuda, "cuDevicePrimaryCtxRelease_v2", None) or getattr(cuda, "cuDevicePrimaryCtxRelease", None)
device, context = ctypes.c_int(), ctypes.c_void_p()
t0 = time.perf_counter()
call("cuInit", 0)
t_init = time.perf_counter()
call("cuDeviceGet", ctypes.byref(device), ordinal)
call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
call("cuCtxSetCurrent", context)
call("cuCtxSynchronize")
t1 = time.perf_counter()
if release is not None:
    release(device)
say(ok=True, load_ms=(t_loaded - t_load) * 1e3, cuinit_ms=(t_init - t0) * 1e3, context_ms=(t1 - t0) * 1e3)
"""

# CUDA errors that deserve a word of explanation in the report.
ERROR_HINTS = {
    "CUDA_ERROR_NO_DEVICE": "the driver sees no GPU (CUDA_VISIBLE_DEVICES, container runtime?)",
    "CUDA_ERROR_INVALID_DEVICE": "no GPU with this ordinal",
    "CUDA_ERROR_DEVICE_UNAVAILABLE": "the GPU is busy or in EXCLUSIVE_PROCESS compute mode (nvidia-smi -q, Compute Mode)",
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": "the kernel module and libcuda versions differ (reboot or reinstall the driver)",
    "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": "a CUDA forward-compatibility libcuda is used on a GPU that does not support it",
}


class ContextInitError(RuntimeError):
    """A child could not create a CUDA context; the message says which call failed and why."""


@dataclass
class InitTiming:
    cuinit_ms: float  # cuInit alone
    context_ms: float  # cuInit through a usable context
    load_ms: float | None = None  # dlopen of libcuda, before the clock starts


def run_child(ordinal: int, libcuda: str = LIBCUDA, timeout_s: float = CHILD_TIMEOUT_S,
              python: str = sys.executable, env: dict[str, str] | None = None) -> InitTiming:
    # -I: isolated from PYTHON* variables and site-packages; the child needs only the stdlib.
    cmd = [python, "-I", "-c", CHILD_SCRIPT, str(ordinal), libcuda]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:  # a process stuck inside the driver may not even die; do not wait for it forever
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        raise ContextInitError(f"creating a CUDA context on GPU {ordinal} did not finish in {timeout_s:.0f} s") from None
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return parse_child_output(stdout, returncode=proc.returncode, stderr=stderr)


def parse_child_output(stdout: str, returncode: int = 0, stderr: str = "") -> InitTiming:
    """The child's last JSON line as timings; raises Skip (no driver) or ContextInitError."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        report = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict):
        said = (stderr.strip().splitlines() or lines or ["no output"])[-1]
        raise ContextInitError(f"the context-creation child exited with {returncode}: {said[:300]}")
    if report.get("no_driver"):
        raise Skip(str(report.get("error") or "no CUDA driver"))
    if not report.get("ok"):
        raise ContextInitError(_explained(str(report.get("error") or "unknown error")))
    try:
        timing = InitTiming(float(report["cuinit_ms"]), float(report["context_ms"]),
                            float(report["load_ms"]) if report.get("load_ms") is not None else None)
    except (KeyError, TypeError, ValueError):
        raise ContextInitError(f"the context-creation child printed an unexpected report: {lines[-1][:300]}") from None
    if not (0 <= timing.cuinit_ms <= timing.context_ms):
        raise ContextInitError(f"the context-creation child printed inconsistent times: {lines[-1][:300]}")
    return timing


def _explained(error: str) -> str:
    for name, hint in ERROR_HINTS.items():
        if name in error:
            return f"{error}: {hint}"
    return error
