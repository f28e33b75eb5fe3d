"""What the stand-ins for torch.cuda in the benchmark tests share: an event timed with the host
clock, and a `torch` whose tensor factories keep tensors on the CPU. Each test file builds its own
`cuda` on these, with the behaviour it checks (a stuck copy, a failing registration...). They check
the control flow of the CUDA paths, not CUDA semantics."""

from __future__ import annotations

import time
from typing import Any

import torch


class HostClockEvent:
    """A CUDA event that is done when recorded, timed with the host clock."""

    def __init__(self, enable_timing: bool = False):
        self.at: float | None = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def elapsed_time(self, end: "HostClockEvent") -> float:
        return (end.at - self.at) * 1000.0

    def synchronize(self):
        pass

    def query(self) -> bool:
        return True


class CpuTorch:
    """torch with `cuda` replaced; tensor factories ignore the device and pinning."""

    def __init__(self, cuda: Any):
        self.cuda = cuda

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, *shape, device=None, pin_memory=False, **kw):
        return torch.empty(*shape, **kw)

    def ones(self, *shape, device=None, **kw):
        return torch.ones(*shape, **kw)

    def zeros(self, *shape, device=None, **kw):
        return torch.zeros(*shape, **kw)
