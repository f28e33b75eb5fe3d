"""gpu.model and gpu.uniform: is this the GPU you paid for, and are all of them alike?"""

from __future__ import annotations

import re

from ..facts import Gpu
from ..record import Finding
from .common import FAIL, PASS, SKIP, WARN, Context, finding, gib, subject, why_missing
from . import reference
from .reference import SOURCE_NOTE, TRUNCATION_MARK, Reference

# Words in a product name that make it a different product tier, not just another form factor.
_TIER_WORDS = {"ti", "super", "d", "nvl", "3e", "max", "laptop", "mobile", "lc", "v2"}  # "max": Max-Q


def check_model(ctx: Context) -> list[Finding]:
    expect = (ctx.options.get("expect") or "").strip()
    if not ctx.machine.gpus:
        return [_no_gpu(ctx)]
    return [_model(gpu, ctx.ref(gpu), expect) for gpu in ctx.machine.gpus]


def _no_gpu(ctx: Context) -> Finding:
    """No GPU found. From a capture that only means the capture holds no GPU facts; on a live run
    on a machine rented for its GPU, it is a problem: the verdict must not read PASS."""
    why = ctx.machine.gpu_error or "no NVIDIA GPU found"
    if ctx.machine.source != "live" or ctx.options.get("device") == "cpu":  # a capture, or a run asked to use the CPU
        return finding("gpu.model", "gpu", SKIP, f"no GPU facts: {why}")
    return finding("gpu.model", "gpu", WARN, f"no NVIDIA GPU visible: {why}",
                   measured=f"0 GPUs visible to NVML ({why})", expected="the GPU(s) this machine was rented with",
                   source="NVML device list",
                   remedy="confirm with `nvidia-smi`, `lsmod | grep nvidia` and `lspci | grep -i nvidia`: if lspci lists a GPU, "
                          "install or load the NVIDIA driver (in a container: start it with `--gpus all`); if not, ask the provider")


def _model(gpu: Gpu, ref: Reference | None, expect: str) -> Finding:
    s = subject(gpu)
    if not gpu.name:
        return finding("gpu.model", s, SKIP, f"model name unknown: {why_missing(gpu, 'name', 'not in the capture')}")
    memory = f", {gib(gpu.memory_total_mib)}" if gpu.memory_total_mib else ""
    described = f"{gpu.name}{memory}"
    if reference.is_truncated(gpu.name):
        return _truncated_model(gpu, ref, expect, described)
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
                       measured=described, expected="a product name the driver knows (not 'Graphics Device')",
                       source="the NVML device name")
    expected_mib = ref.number("nvidia_smi_memory_total_mib")
    if expected_mib and gpu.memory_total_mib and gpu.memory_total_mib < 0.9 * expected_mib:
        return finding(
            "gpu.model", s, WARN,
            f"{gpu.name} reports {gib(gpu.memory_total_mib)}, the model has {gib(expected_mib)}: a cut-down variant or a memory problem",
            measured=gib(gpu.memory_total_mib), expected=gib(expected_mib), source=ref.cite("nvidia_smi_memory_total_mib"),
            remedy="compare with `nvidia-smi --query-gpu=name,memory.total --format=csv` and ask the provider",
        )
    return finding("gpu.model", s, PASS, f"{described} (reference {ref.id})", measured=described,
                   expected=f"{ref.name}" + (f", {gib(expected_mib)}" if expected_mib else ""),
                   source=ref.cite("nvidia_smi_memory_total_mib"))


_FULL_NAME = "`nvidia-smi --query-gpu=name,memory.total --format=csv` (shows the whole name)"


def _truncated_model(gpu: Gpu, ref: Reference | None, expect: str, described: str) -> Finding:
    """A name the plain `nvidia-smi` table cut off ("NVIDIA GeForce ..."): judge only what it shows."""
    s, name = subject(gpu), gpu.name or ""
    cut = f"the nvidia-smi table cut the name off ({name!r})"
    if expect:
        if not truncated_name_fits(expect, gpu):
            return finding("gpu.model", s, FAIL, f"{described} is not the {expect!r} you expected (the part of the name shown, or the memory, differs)",
                           measured=described, expected=expect, source="--expect",
                           remedy=f"confirm with {_FULL_NAME}; ask the provider for the model you paid for")
        return finding("gpu.model", s, SKIP, f"{cut}: it fits {expect!r} as far as it goes, but cannot confirm it",
                       measured=described, expected=expect, source="--expect", remedy=f"run {_FULL_NAME}")
    if ref is not None:
        return finding("gpu.model", s, PASS,
                       f"{described}: {cut}; taken as {ref.name}, the only reference model with this prefix and memory (reference {ref.id})",
                       measured=described, expected=ref.name, source=SOURCE_NOTE, remedy=f"confirm with {_FULL_NAME}")
    candidates = reference.truncated_candidates(name, gpu.memory_total_mib)
    could_be = (f"could be {', '.join(c.name for c in candidates)}" if candidates
                else "no reference model fits it")
    return finding("gpu.model", s, SKIP, f"model unknown: {cut}; {could_be}; model-specific checks skip",
                   measured=described, remedy=f"run {_FULL_NAME}, or capture `nvidia-smi -q -x`")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _memory_word_fits(word: str, memory_mib: float | None) -> bool | None:
    """None when `word` is no memory size ("80GB", "24G"); else whether the memory is within 10% of it."""
    size = re.fullmatch(r"(\d+)g(?:b|ib)?", word)
    if not size:
        return None
    gb = int(size.group(1))
    return bool(memory_mib) and abs(memory_mib / 1024 - gb) <= 0.1 * gb


def matches_expectation(expect: str, gpu: Gpu) -> bool:
    """Does the user's "A100 80GB" describe this GPU? Every word must fit; tier words must agree.

    Memory words ("80GB", "24G") are compared with the memory the GPU reports (within 10%),
    so "H100 80GB" matches "NVIDIA H100 PCIe" with 80 GB. Form factors (PCIe, SXM) only count
    when the user names them; tier words (Ti, SUPER, D, NVL) always count, so "RTX 4090" is
    not an "RTX 4090 D".
    """
    return _name_matches(expect, gpu.name or "", gpu.memory_total_mib)


def _name_matches(expect: str, name: str, memory_mib: float | None) -> bool:
    name_words, joined = set(_words(name)), "".join(_words(name))
    for word in _words(expect):
        fits = _memory_word_fits(word, memory_mib)
        if fits is False:
            return False
        if fits is None and word != "nvidia" and word not in name_words and word not in joined:  # "rtx4090" too
            return False
    return (name_words & _TIER_WORDS) <= set(_words(expect))


def truncated_name_fits(expect: str, gpu: Gpu) -> bool:
    """Could a cut-off name ("Tesla V100-SXM2...") be the `expect`ed model? False only when what it
    shows contradicts it: another model number, other memory, or a prefix no expected model has."""
    visible = (gpu.name or "").strip()[: -len(TRUNCATION_MARK)]
    words = _words(visible)
    cut_mid_word = bool(words) and visible[-1:].isalnum()
    complete, partial = (words[:-1], words[-1]) if cut_mid_word else (words, "")
    joined = "".join(words)
    shows_model_number = any(any(ch.isdigit() for ch in w) for w in complete)
    for word in _words(expect):
        fits = _memory_word_fits(word, gpu.memory_total_mib)
        if fits is not None:
            if not fits and gpu.memory_total_mib:
                return False
            continue
        if word == "nvidia" or word in complete or word in joined or (partial and word.startswith(partial)):
            continue
        if shows_model_number and any(ch.isdigit() for ch in word):
            return False  # the visible part already names another model ("V100" when "A100" was expected)
    # A known model the user means must start the way the cut-off name does.
    meant = [r for r in reference.all_references() if _name_matches(expect, r.name, r.number("nvidia_smi_memory_total_mib"))]
    prefix = visible.rstrip()
    return not meant or any(r.name.startswith(prefix) or r.name.startswith(f"NVIDIA {prefix}") for r in meant)


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
    for label, value, same in _UNIFORM_FACTS:
        differences += _odd_ones_out(gpus, label, value, same)
    n = len(gpus)
    if differences:
        return [finding("gpu.uniform", "machine", WARN, f"{n} x {gpus[0].name}, configured differently: " + "; ".join(differences),
                        measured="; ".join(differences), expected="identical configuration on every GPU",
                        source="the facts of every GPU, compared with each other",
                        remedy="compare `nvidia-smi --query-gpu=index,memory.total,power.limit,pcie.link.gen.max,pcie.link.width.max,vbios_version --format=csv`")]
    shared = "; ".join(f"{label} {_shown(value(gpus[0]))}{_UNITS.get(label, '')}" for label, value, _ in _UNIFORM_FACTS if value(gpus[0]) is not None)
    return [finding("gpu.uniform", "machine", PASS, f"{n} x {gpus[0].name}: same memory, power limit, link and VBIOS",
                    measured=f"{n} GPUs alike: {shared}", expected="identical configuration on every GPU",
                    source="the facts of every GPU, compared with each other")]


def _same(a, b) -> bool:
    return a == b


def _close_memory(a: float, b: float) -> bool:
    # Boards of one model differ by a few MiB (GTX 1070: 8112 and 8114 MiB); that is not a difference.
    return abs(a - b) <= _MEMORY_SLACK * max(a, b)


_MEMORY_SLACK = 0.01

_UNIFORM_FACTS = (
    ("memory", lambda g: g.memory_total_mib, _close_memory),
    ("power limit", lambda g: g.power.enforced_limit_w, _same),
    ("max PCIe link", lambda g: _max_link(g), _same),
    ("VBIOS", lambda g: g.vbios, _same),
    ("ECC", lambda g: g.ecc.enabled, _same),
    ("MIG", lambda g: g.mig_enabled, _same),
)
_UNITS = {"memory": " MiB", "power limit": " W"}


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _max_link(gpu: Gpu) -> str | None:
    for r in gpu.pcie.readings:
        if r.max_gen or r.max_width:
            return f"Gen{r.max_gen} x{r.max_width}"
    return None


def _odd_ones_out(gpus: list[Gpu], label: str, value, same) -> list[str]:
    seen = [(g, value(g)) for g in gpus if value(g) is not None]
    if not seen:
        return []
    values = [v for _, v in seen]
    common = max(values, key=lambda v: sum(1 for w in values if same(v, w)))
    odd = [(g, v) for g, v in seen if not same(v, common)]
    if not odd:
        return []
    unit = _UNITS.get(label, "")
    shown = ", ".join(f"gpu{g.index} {_shown(v)}{unit}" for g, v in odd)
    return [f"{label} {shown} (others {_shown(common)}{unit})"]
