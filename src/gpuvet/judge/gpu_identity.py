"""gpu.model and gpu.uniform: is this the GPU you paid for, and are all of them alike?"""

from __future__ import annotations

import difflib
import re

from ..catalog import checked
from ..facts import Gpu
from ..record import Finding
from .common import FAIL, PASS, SKIP, WARN, Context, finding, gib, subject, why_missing
from ..specs import reference
from ..specs.reference import SOURCE_NOTE, TRUNCATION_MARK, Reference

# The checks this module judges, by their catalogue ids (catalog.checked refuses an id it lacks).
GPU_MODEL = checked("gpu.model")
GPU_UNIFORM = checked("gpu.uniform")

# Words in a product name that make it a different product tier, not just another form factor.
_TIER_WORDS = {"ti", "super", "d", "nvl", "3e", "max", "laptop", "mobile", "lc", "v2"}  # "max": Max-Q


def check_model(ctx: Context) -> list[Finding]:
    expect = (ctx.options.get("expect") or "").strip()
    if not ctx.machine.gpus:
        return [_no_gpu(ctx)]
    return [_model(gpu, ctx.ref(gpu), expect) for gpu in ctx.machine.gpus]


def _no_gpu(ctx: Context) -> Finding:
    """No GPU found. From a capture that only means the capture holds no GPU facts; on a live run
    on a machine rented for its GPU, it is a problem: the verdict must not read PASS, and a run
    told which GPU was paid for (--expect) has failed to find it."""
    why = ctx.machine.gpu_error or "no NVIDIA GPU found"
    expect = (ctx.options.get("expect") or "").strip()
    if ctx.machine.source != "live" or ctx.options.get("device") == "cpu":  # a capture, or a run asked to use the CPU
        return finding(GPU_MODEL, "gpu", SKIP, f"no GPU facts: {why}")
    remedy = ("confirm with `nvidia-smi`, `lsmod | grep nvidia` and `lspci | grep -i nvidia`: if lspci lists a GPU, "
              "install or load the NVIDIA driver (in a container: start it with `--gpus all`); if not, ask the provider")
    measured = f"0 GPUs visible to NVML ({why})"
    if expect:
        return finding(GPU_MODEL, "gpu", FAIL, f"expected {expect}; no NVIDIA GPU visible: {why}",
                       measured=measured, expected=expect, source="--expect", remedy=remedy)
    return finding(GPU_MODEL, "gpu", WARN, f"no NVIDIA GPU visible: {why}",
                   measured=measured, expected="the GPU(s) this machine was rented with",
                   source="NVML device list", remedy=remedy)


# `lspci` names a GPU from the PCI ID database: "NVIDIA Corporation GA100 [A100 SXM4 80GB]". The
# bracketed marketing name is what gpuvet can judge --expect against when no driver named the GPU.
_LSPCI_ONLY = re.compile(r"only lspci saw this GPU: .*\[(?P<model>[^\]]+)\]")
_PCI_IDS_SOURCE = "the device name lspci reads from the PCI ID database (pci.ids), not from the driver"


def _lspci_model(gpu: Gpu) -> str | None:
    m = _LSPCI_ONLY.search(why_missing(gpu, "name", ""))
    return m.group("model").strip() if m and not re.fullmatch(r"[0-9a-f]{4}(:[0-9a-f]{4})?", m.group("model").strip()) else None


def _unnamed_model(gpu: Gpu, expect: str) -> Finding:
    """No driver-reported name: judge --expect against lspci's name, or say it could not be checked."""
    s, why = subject(gpu), why_missing(gpu, "name", "not in the capture")
    confirm = "capture `nvidia-smi --query-gpu=name,memory.total --format=csv` (or `nvidia-smi -q -x`) on the machine"
    lspci_model = _lspci_model(gpu)
    if expect and lspci_model:
        if _name_matches(expect, lspci_model, None):
            return finding(GPU_MODEL, s, PASS, f"lspci names it {lspci_model!r}: the model you expected ({expect!r})",
                           measured=lspci_model, expected=expect, source=_PCI_IDS_SOURCE, remedy=f"confirm: {confirm}")
        return finding(GPU_MODEL, s, FAIL, f"lspci names it {lspci_model!r}, not the {expect!r} you expected",
                       measured=lspci_model, expected=expect, source=_PCI_IDS_SOURCE,
                       remedy=f"ask the provider for the model you paid for; {confirm}")
    if expect:
        return finding(GPU_MODEL, s, WARN, f"cannot check that this is the {expect!r} you expected: model name unknown ({why})",
                       measured=why, expected=expect, source="--expect", remedy=confirm)
    return finding(GPU_MODEL, s, SKIP, f"model name unknown: {why}")


def _model(gpu: Gpu, ref: Reference | None, expect: str) -> Finding:
    s = subject(gpu)
    if not gpu.name:
        return _unnamed_model(gpu, expect)
    memory = f", {gib(gpu.memory_total_mib)}" if gpu.memory_total_mib else ""
    described = f"{gpu.name}{memory}"
    if reference.is_truncated(gpu.name):
        return _truncated_model(gpu, ref, expect, described)
    if expect:
        if matches_expectation(expect, gpu):
            row = f" (reference {ref.id})" if ref else ""
            return finding(GPU_MODEL, s, PASS, f"{described}{row}: the model you expected ({expect!r})",
                           measured=described, expected=expect, source="--expect" + (f"; {SOURCE_NOTE}, row {ref.id}" if ref else ""))
        return finding(
            GPU_MODEL, s, FAIL, f"{described} is not the {expect!r} you expected",
            measured=described, expected=expect, source="--expect",
            remedy="ask the provider for the model you paid for; confirm with "
                   "`nvidia-smi --query-gpu=name,memory.total --format=csv`",
        )
    if gpu.name == "Graphics Device":
        return finding(GPU_MODEL, s, WARN, "the driver does not know this GPU's name ('Graphics Device'): driver older than the GPU",
                       measured=gpu.name, remedy="install a driver that supports this GPU, then check `nvidia-smi -L`")
    if ref is None:
        return finding(GPU_MODEL, s, PASS, f"{described}; no reference figures for this model, model-specific checks skip",
                       measured=described, expected="a product name the driver knows (not 'Graphics Device')",
                       source="the NVML device name")
    expected_mib = ref.number("nvidia_smi_memory_total_mib")
    if expected_mib and gpu.memory_total_mib and gpu.memory_total_mib < 0.9 * expected_mib:
        return finding(
            GPU_MODEL, s, WARN,
            f"{gpu.name} reports {gib(gpu.memory_total_mib)}, the model has {gib(expected_mib)}: a cut-down variant or a memory problem",
            measured=gib(gpu.memory_total_mib), expected=gib(expected_mib), source=ref.cite("nvidia_smi_memory_total_mib"),
            remedy="compare with `nvidia-smi --query-gpu=name,memory.total --format=csv` and ask the provider",
        )
    return finding(GPU_MODEL, s, PASS, f"{described} (reference {ref.id})", measured=described,
                   expected=f"{ref.name}" + (f", {gib(expected_mib)}" if expected_mib else ""),
                   source=ref.cite("nvidia_smi_memory_total_mib"))


_FULL_NAME = "`nvidia-smi --query-gpu=name,memory.total --format=csv` (shows the whole name)"


def _truncated_model(gpu: Gpu, ref: Reference | None, expect: str, described: str) -> Finding:
    """A name the plain `nvidia-smi` table cut off ("NVIDIA GeForce ..."): judge only what it shows."""
    s, name = subject(gpu), gpu.name or ""
    cut = f"the nvidia-smi table cut the name off ({name!r})"
    if expect:
        if not truncated_name_fits(expect, gpu):
            return finding(GPU_MODEL, s, FAIL, f"{described} is not the {expect!r} you expected (the part of the name shown, or the memory, differs)",
                           measured=described, expected=expect, source="--expect",
                           remedy=f"confirm with {_FULL_NAME}; ask the provider for the model you paid for")
        return finding(GPU_MODEL, s, SKIP, f"{cut}: it fits {expect!r} as far as it goes, but cannot confirm it",
                       measured=described, expected=expect, source="--expect", remedy=f"run {_FULL_NAME}")
    if ref is not None:
        return finding(GPU_MODEL, s, PASS,
                       f"{described}: {cut}; taken as {ref.name}, the only reference model with this prefix and memory (reference {ref.id})",
                       measured=described, expected=ref.name, source=SOURCE_NOTE, remedy=f"confirm with {_FULL_NAME}")
    candidates = reference.truncated_candidates(name, gpu.memory_total_mib)
    could_be = (f"could be {', '.join(c.name for c in candidates)}" if candidates
                else "no reference model fits it")
    return finding(GPU_MODEL, s, SKIP, f"model unknown: {cut}; {could_be}; model-specific checks skip",
                   measured=described, remedy=f"run {_FULL_NAME}, or capture `nvidia-smi -q -x`")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _expect_words(expect: str) -> list[str]:
    """The user's words, with a memory size written apart joined up: "80 GB" -> "80gb"."""
    words = _words(expect)
    joined: list[str] = []
    for word in words:
        if joined and word in ("gb", "gib", "g") and joined[-1].isdigit():
            joined[-1] += word
        else:
            joined.append(word)
    return joined


# Form-factor words: "SXM" names every SXM generation ("SXM4", "SXM5"), so it fits them as a prefix.
_FORM_FACTORS = ("sxm", "pcie", "nvl")
_IGNORED = {"nvidia"}


def _fits_token(word: str, tokens: list[str]) -> bool:
    """`word` is one whole token of the name, or several adjacent ones written together
    ("rtx4090", "4090d"); never part of one: "A10" is not "A100", "L4" not "L40S", "H20" not "H200"."""
    if word in tokens or any(_same_form_factor(word, token) for token in tokens):
        return True
    return any("".join(tokens[i:j]) == word for i in range(len(tokens)) for j in range(i + 2, len(tokens) + 1))


def _same_form_factor(a: str, b: str) -> bool:
    """ "sxm" and "sxm5" (a generation left out) name one form factor; "sxm4" and "sxm5" do not."""
    for form in _FORM_FACTORS:
        rest_a, rest_b = a[len(form):], b[len(form):]
        if a.startswith(form) and b.startswith(form) and all(r == "" or r.isdigit() for r in (rest_a, rest_b)):
            return not rest_a or not rest_b or rest_a == rest_b
    return False


def _reference_tokens(ref: Reference | None) -> list[list[str]]:
    """Other ways to name the matched reference model: its id ("H100-SXM5-80GB" for the NVML
    name "NVIDIA H100 80GB HBM3") and the form factor noted beside its name ("NVIDIA H800 (SXM)")."""
    if ref is None:
        return []
    id_words = _words(re.sub(r"\([^)]*\)", " ", ref.id))
    notes = re.findall(r"\(([^)]*)\)", ref.id + " " + ref.row.get("nvidia_smi_names", "").split(";")[0])
    forms = [w for note in notes for w in _words(note) if w in _FORM_FACTORS]
    return [id_words + forms]


_MEMORY_WORD = re.compile(r"(\d+)g(?:b|ib)?")


def _memory_word_fits(word: str, memory_mib: float | None) -> bool | None:
    """None when `word` is no memory size ("80GB", "24G") or the memory is unknown; else whether
    the memory is within 10% of it."""
    size = _MEMORY_WORD.fullmatch(word)
    if not size or not memory_mib:
        return None
    gb = int(size.group(1))
    return abs(memory_mib / 1024 - gb) <= 0.1 * gb


def matches_expectation(expect: str, gpu: Gpu) -> bool:
    """Does the user's "A100 80GB" describe this GPU? Every word must fit; tier words must agree.

    Words match whole tokens of the name (or of the matched reference row's id, so "H100 SXM"
    fits "NVIDIA H100 80GB HBM3", row H100-SXM5-80GB). Memory words ("80GB", "80 GB") are compared
    with the memory the GPU reports (within 10%), so "H100 80GB" matches "NVIDIA H100 PCIe" with
    80 GB. Form factors (PCIe, SXM) only count when the user names them; tier words (Ti, SUPER,
    D, NVL) always count, so "RTX 4090" is not an "RTX 4090 D".
    """
    name = gpu.name or ""
    return _name_matches(expect, name, gpu.memory_total_mib, reference.match(name, gpu.memory_total_mib))


def _name_matches(expect: str, name: str, memory_mib: float | None, ref: Reference | None = None) -> bool:
    spellings = [_words(name)] + _reference_tokens(ref)
    expected = _expect_words(expect)
    for word in expected:
        if word in _IGNORED:
            continue
        fits = _memory_word_fits(word, memory_mib)
        if fits is False:
            return False
        if fits is None and not any(_fits_token(word, tokens) for tokens in spellings):
            return False
    # A tier word of the name must be asked for, alone or stuck to a number ("4090D", "1080Ti").
    asked = set(expected) | {part for word in expected for part in re.findall(r"[a-z]+|\d+", word)}
    return (set(_words(name)) & _TIER_WORDS) <= asked


def truncated_name_fits(expect: str, gpu: Gpu) -> bool:
    """Could a cut-off name ("Tesla V100-SXM2...") be the `expect`ed model? False only when what it
    shows contradicts it: another model number, other memory, or a prefix no expected model has."""
    visible = (gpu.name or "").strip()[: -len(TRUNCATION_MARK)]
    words = _words(visible)
    cut_mid_word = bool(words) and visible[-1:].isalnum()
    complete, partial = (words[:-1], words[-1]) if cut_mid_word else (words, "")
    shows_model_number = any(any(ch.isdigit() for ch in w) for w in complete)
    for word in _expect_words(expect):
        if _MEMORY_WORD.fullmatch(word):
            if _memory_word_fits(word, gpu.memory_total_mib) is False:
                return False
            continue
        if word in _IGNORED or _fits_token(word, complete) or (partial and word.startswith(partial)):
            continue
        if shows_model_number and any(ch.isdigit() for ch in word):
            return False  # the visible part already names another model ("V100" when "A100" was expected)
    # A known model the user means must start the way the cut-off name does.
    meant = [r for r in reference.all_references() if _name_matches(expect, r.name, r.number("nvidia_smi_memory_total_mib"), r)]
    prefix = visible.rstrip()
    return not meant or any(r.name.startswith(prefix) or r.name.startswith(f"NVIDIA {prefix}") for r in meant)


# -- gpu.uniform ------------------------------------------------------------------------------

def check_uniform(ctx: Context) -> list[Finding]:
    gpus = [g for g in ctx.machine.gpus if g.name or g.memory_total_mib]
    if len(gpus) < 2:
        return [finding(GPU_UNIFORM, "machine", SKIP, "fewer than two GPUs with known facts: nothing to compare")]
    models = {g.name for g in gpus}
    if len(models) > 1:
        listing = "; ".join(f"gpu{g.index} {g.name}" for g in gpus)
        return [finding(GPU_UNIFORM, "machine", FAIL, f"mixed GPU models: {listing}",
                        measured=listing, expected="one model on every GPU",
                        remedy="ask the provider for a node with identical GPUs; the slowest sets the pace of a multi-GPU job")]
    differences = []
    for label, value, same in _UNIFORM_FACTS:
        differences += _odd_ones_out(gpus, label, value, same)
    n = len(gpus)
    if differences:
        return [finding(GPU_UNIFORM, "machine", WARN, f"{n} x {gpus[0].name}, configured differently: " + "; ".join(differences),
                        measured="; ".join(differences), expected="identical configuration on every GPU",
                        source="the facts of every GPU, compared with each other",
                        remedy="compare `nvidia-smi --query-gpu=index,memory.total,power.limit,pcie.link.gen.max,pcie.link.width.max,vbios_version --format=csv`")]
    # Name only the facts actually compared: known on at least two GPUs.
    compared = [(label, value) for label, value, _ in _UNIFORM_FACTS if sum(value(g) is not None for g in gpus) >= 2]
    if not compared:
        return [finding(GPU_UNIFORM, "machine", SKIP, f"{n} x {gpus[0].name}: no configuration fact (memory, power limit, "
                                                        "link, VBIOS) known on two GPUs to compare")]
    shared = "; ".join(f"{label} {_shown(value(gpus[0]))}{_UNITS.get(label, '')}" for label, value in compared if value(gpus[0]) is not None)
    labels = [label for label, _ in compared]
    listed = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + f" and {labels[-1]}"
    unknown = [label for label, _, _ in _UNIFORM_FACTS if label not in labels]
    return [finding(GPU_UNIFORM, "machine", PASS, f"{n} x {gpus[0].name}: same {listed}",
                    measured=f"{n} GPUs alike: {shared}" + (f"; not in the facts: {', '.join(unknown)}" if unknown else ""),
                    expected="identical configuration on every GPU",
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


def expect_typo(expect: str) -> str | None:
    """The known model a mistyped --expect most likely meant ("H10O 80GB" -> "H100 80GB"), or
    None: some known model fits it, or no known model is close (a model gpuvet has no reference
    for is judged as written). A typo is the user's mistake, not a FAIL of the machine."""
    refs = reference.all_references()
    if any(_known_model_fits(expect, r) for r in refs):
        return None
    tokens = {t for r in refs for tokens in [_words(r.name), *_reference_tokens(r)] for t in tokens}
    words = re.findall(r"[A-Za-z0-9]+|[^A-Za-z0-9]+", expect)
    changed = False
    for i, word in enumerate(words):
        low = word.lower()
        if not low.isalnum() or low in tokens or _MEMORY_WORD.fullmatch(low) or low in _IGNORED:
            continue
        # The letter O typed for a zero ("A1OO") first, then any close spelling.
        digits = low.translate(_LOOK_ALIKE) if any(c.isdigit() for c in low) else low
        close = [digits] if digits in tokens else difflib.get_close_matches(low, sorted(tokens), n=1, cutoff=0.7)
        if close:
            words[i], changed = close[0].upper() if word.isupper() or any(c.isdigit() for c in word) else close[0], True
    guess = "".join(words)
    return guess if changed and any(_known_model_fits(guess, r) for r in refs) else None


_LOOK_ALIKE = str.maketrans("o", "0")  # the typo of a rented-GPU name: O for 0


def _known_model_fits(expect: str, ref: Reference) -> bool:
    return _name_matches(expect, ref.name, ref.number("nvidia_smi_memory_total_mib"), ref)
