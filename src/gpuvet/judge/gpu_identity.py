"""gpu.model and gpu.uniform: is this the GPU you paid for, and are all of them alike?"""

from __future__ import annotations

import re

from ..facts import Gpu
from ..record import Finding
from .common import FAIL, PASS, SKIP, WARN, Context, finding, gib, subject, why_missing
from .reference import SOURCE_NOTE, Reference

# Words in a product name that make it a different product tier, not just another form factor.
_TIER_WORDS = {"ti", "super", "d", "nvl", "3e", "max", "laptop", "mobile", "lc", "v2"}  # "max": Max-Q


def check_model(ctx: Context) -> list[Finding]:
    expect = (ctx.options.get("expect") or "").strip()
    return [_model(gpu, ctx.ref(gpu), expect) for gpu in ctx.machine.gpus]


def _model(gpu: Gpu, ref: Reference | None, expect: str) -> Finding:
    s = subject(gpu)
    if not gpu.name:
        return finding("gpu.model", s, SKIP, f"model name unknown: {why_missing(gpu, 'name', 'not in the capture')}")
    memory = f", {gib(gpu.memory_total_mib)}" if gpu.memory_total_mib else ""
    described = f"{gpu.name}{memory}"
    if expect:
        if matches_expectation(expect, gpu):
            return finding("gpu.model", s, PASS, f"{described}: the model you expected ({expect!r})",
                           measured=described, expected=expect, source="--expect")
        return finding(
            "gpu.model", s, FAIL, f"{described} is not the {expect!r} you expected",
            measured=described, expected=expect, source="--expect",
            remedy="ask the provider for the model you paid for; confirm with "
                   "`nvidia-smi --query-gpu=name,memory.total --format=csv`",
        )
    if gpu.name == "Graphics Device":
        return finding("gpu.model", s, WARN, "the driver does not know this GPU's name ('Graphics Device'): driver older than the GPU",
                       measured=gpu.name, remedy="install a driver that supports this GPU, then check `nvidia-smi -L`")
    if ref is None:
        return finding("gpu.model", s, PASS, f"{described}; no reference figures for this model, model-specific checks skip",
                       measured=described)
    expected_mib = ref.number("nvidia_smi_memory_total_mib")
    if expected_mib and gpu.memory_total_mib and gpu.memory_total_mib < 0.9 * expected_mib:
        return finding(
            "gpu.model", s, WARN,
            f"{gpu.name} reports {gib(gpu.memory_total_mib)}, the model has {gib(expected_mib)}: a cut-down variant or a memory problem",
            measured=gib(gpu.memory_total_mib), expected=gib(expected_mib), source=ref.cite("nvidia_smi_memory_total_mib"),
            remedy="compare with `nvidia-smi --query-gpu=name,memory.total --format=csv` and ask the provider",
        )
    return finding("gpu.model", s, PASS, f"{described} (reference {ref.id})", measured=described, source=SOURCE_NOTE)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def matches_expectation(expect: str, gpu: Gpu) -> bool:
    """Does the user's "A100 80GB" describe this GPU? Every word must fit; tier words must agree.

    Memory words ("80GB", "24G") are compared with the memory the GPU reports (within 10%),
    so "H100 80GB" matches "NVIDIA H100 PCIe" with 80 GB. Form factors (PCIe, SXM) only count
    when the user names them; tier words (Ti, SUPER, D, NVL) always count, so "RTX 4090" is
    not an "RTX 4090 D".
    """
    name = gpu.name or ""
    name_words, joined = set(_words(name)), "".join(_words(name))
    for word in _words(expect):
        size = re.fullmatch(r"(\d+)g(?:b|ib)?", word)
        if size:
            gb = int(size.group(1))
            if not gpu.memory_total_mib or abs(gpu.memory_total_mib / 1024 - gb) > 0.1 * gb:
                return False
        elif word != "nvidia" and word not in name_words and word not in joined:  # "rtx4090" too
            return False
    return (name_words & _TIER_WORDS) <= set(_words(expect))


# -- gpu.uniform ------------------------------------------------------------------------------

def check_uniform(ctx: Context) -> list[Finding]:
    gpus = [g for g in ctx.machine.gpus if g.name or g.memory_total_mib]
    if len(gpus) < 2:
        return [finding("gpu.uniform", "machine", SKIP, "fewer than two GPUs with known facts: nothing to compare")]
    models = {g.name for g in gpus}
    if len(models) > 1:
        listing = "; ".join(f"gpu{g.index} {g.name}" for g in gpus)
        return [finding("gpu.uniform", "machine", FAIL, f"mixed GPU models: {listing}",
                        measured=listing, expected="one model on every GPU",
                        remedy="ask the provider for a node with identical GPUs; the slowest sets the pace of a multi-GPU job")]
    differences = []
    for label, value in (
        ("memory", lambda g: g.memory_total_mib),
        ("power limit (W)", lambda g: g.power.enforced_limit_w),
        ("max PCIe link", lambda g: _max_link(g)),
        ("VBIOS", lambda g: g.vbios),
        ("ECC", lambda g: g.ecc.enabled),
        ("MIG", lambda g: g.mig_enabled),
    ):
        differences += _odd_ones_out(gpus, label, value)
    n = len(gpus)
    if differences:
        return [finding("gpu.uniform", "machine", WARN, f"{n} x {gpus[0].name}, configured differently: " + "; ".join(differences),
                        measured="; ".join(differences), expected="identical configuration on every GPU",
                        remedy="compare `nvidia-smi --query-gpu=index,power.limit,pcie.link.gen.max,pcie.link.width.max,vbios_version --format=csv`")]
    return [finding("gpu.uniform", "machine", PASS, f"{n} x {gpus[0].name}: same memory, power limit, link and VBIOS")]


def _max_link(gpu: Gpu) -> str | None:
    for r in gpu.pcie.readings:
        if r.max_gen or r.max_width:
            return f"Gen{r.max_gen} x{r.max_width}"
    return None


def _odd_ones_out(gpus: list[Gpu], label: str, value) -> list[str]:
    seen = [(g, value(g)) for g in gpus if value(g) is not None]
    if len({v for _, v in seen}) <= 1:
        return []
    values = [v for _, v in seen]
    common = max(set(values), key=values.count)
    odd = [f"gpu{g.index} {v}" for g, v in seen if v != common]
    return [f"{label} {', '.join(odd)} (others {common})"]
