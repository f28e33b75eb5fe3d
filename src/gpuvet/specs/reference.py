"""Reference figures per GPU model (data/gpu_specs.csv, with a source for every row).

A GPU is matched on its exact NVML product name; nothing is matched on substrings, because
names share prefixes ("NVIDIA H100" / "NVIDIA H100 PCIe" / "NVIDIA H100 NVL" are three cards).
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass
from importlib import resources

SPECS_FILE = "gpu_specs.csv"
SOURCE_NOTE = "gpuvet reference data (specs/data/gpu_specs.csv)"
TRUNCATION_MARK = "..."  # the plain `nvidia-smi` table cuts long names: "NVIDIA GeForce ..."
_MEMORY_TOLERANCE = 0.10  # ECC on GDDR boards hides 1/16 of the memory (RTX 4090: 24564 -> 23028 MiB)


@dataclass(frozen=True)
class Reference:
    row: dict[str, str]

    @property
    def id(self) -> str:
        return self.row["gpu_model"]

    @property
    def name(self) -> str:
        return primary_name(self.row)

    @property
    def source(self) -> str:
        return self.row.get("source", "")

    def number(self, column: str) -> float | None:
        """A figure from the table; None when the cell is empty or "n/a" (not supported)."""
        raw = (self.row.get(column) or "").strip()
        try:
            return float(raw)
        except ValueError:
            return None

    @property
    def nvlink(self) -> str | None:
        """ "integral" (SXM boards), "bridge" (optional on PCIe cards), "none", or None: unknown."""
        gen = (self.row.get("nvlink_gen") or "").strip().lower()
        if not gen:
            return None
        if gen == "none":
            return "none"
        if "bridge" in gen or "pcie" in self.id.lower() or self.id in ("A30", "A40"):
            return "bridge"
        return "integral"

    @property
    def peer_to_peer(self) -> bool | None:
        """False where the product has no GPU-to-GPU peer access at all (GeForce Ada and Blackwell:
        the driver never enables it); True where it has; None: not recorded."""
        cell = (self.row.get("peer_to_peer") or "").strip().lower()
        return {"no": False, "yes": True}.get(cell)

    def published_matmul(self, dtype: str) -> PublishedMatmul | None:
        """The lowest matmul rate published for this model in `dtype` (other methods than
        mamf-finder: a single shape, a hand kernel), or None. bf16 takes an fp16 figure where the
        row gives both the same dense peak: the tensor cores run them at one rate."""
        found = _published_rates(self.row.get("other_measured_matmul_tflops") or "")
        same_rate = self.number("bf16_tensor_tflops_dense") == self.number("fp16_tensor_tflops_dense")
        for wanted in (dtype, "fp16") if dtype == "bf16" and same_rate else (dtype,):
            if wanted in found:
                return PublishedMatmul(found[wanted], wanted, self.row["other_measured_matmul_tflops"].strip())
        return None

    def cite(self, column: str) -> str:
        """Where a figure comes from, for a finding's evidence."""
        return f"{SOURCE_NOTE}, row {self.id}, column {column}; sources: {self.source}"


@dataclass(frozen=True)
class PublishedMatmul:
    tflops: float
    dtype: str  # the dtype the figure was published for (fp16 standing in for bf16)
    text: str  # the cell, with who measured it and how


# "bf16 170.06-173.31 / fp16 165-171 (zzc0721 torch test); fp16 hgemm 163.5 (xytpai/gpuk)"
_RATE = re.compile(r"\b(bf16|fp16|fp8|tf32|fp32)\b[^0-9/;]*?(\d+(?:\.\d+)?)(?:-\d+(?:\.\d+)?)?")


def _published_rates(cell: str) -> dict[str, float]:
    """dtype -> the lowest figure the cell gives for it (a range counts by its low end)."""
    rates: dict[str, float] = {}
    for dtype, value in _RATE.findall(cell):
        rates[dtype] = min(float(value), rates.get(dtype, float("inf")))
    return rates


def nvml_names(row: dict[str, str]) -> list[str]:
    """The NVML names in a row's cell, without the notes in brackets ("NVIDIA H800 (SXM)" is "NVIDIA H800")."""
    return [re.sub(r"\s*\([^)]*\)", "", name).strip() for name in row["nvidia_smi_names"].split(";") if name.strip()]


def primary_name(row: dict[str, str]) -> str:
    # The first name is the product's exact NVML name; later ones are variants with their own
    # specs ("NVIDIA H800 PCIe (PCIe card)"), which must not inherit this row's figures.
    return nvml_names(row)[0]


@functools.cache
def _table() -> dict[str, Reference]:
    text = resources.files("gpuvet.specs").joinpath("data").joinpath(SPECS_FILE).read_text(encoding="utf-8")
    return {primary_name(row): Reference(row) for row in csv.DictReader(text.splitlines())}


def is_truncated(name: str | None) -> bool:
    return bool(name and name.strip().endswith(TRUNCATION_MARK))


def match(name: str | None, memory_mib: float | None = None) -> Reference | None:
    """The reference row for an exact NVML name (old drivers omit the "NVIDIA " prefix).

    A name cut off by the nvidia-smi table matches only when one row fits its prefix and the
    memory the GPU reports (`truncated_candidates`); otherwise the model is unknown.
    """
    if not name:
        return None
    if is_truncated(name):
        candidates = truncated_candidates(name, memory_mib)
        return candidates[0] if len(candidates) == 1 else None
    table = _table()
    name = name.strip()
    return table.get(name) or table.get(f"NVIDIA {name}")


def truncated_candidates(name: str, memory_mib: float | None = None) -> list[Reference]:
    """Reference rows whose NVML name starts with what is left of a cut-off name, and whose memory
    is within 10% of `memory_mib` when both are known."""
    prefix = name.strip()[: -len(TRUNCATION_MARK)].rstrip()
    if not prefix:
        return []
    found = [ref for full, ref in _table().items() if full.startswith(prefix) or full.startswith(f"NVIDIA {prefix}")]
    if memory_mib:
        found = [ref for ref in found if _memory_fits(ref, memory_mib)]
    return found


def _memory_fits(ref: Reference, memory_mib: float) -> bool:
    expected = ref.number("nvidia_smi_memory_total_mib")
    return expected is None or abs(memory_mib - expected) <= _MEMORY_TOLERANCE * expected


def by_id(ref_id: str | None) -> Reference | None:
    return next((r for r in _table().values() if r.id == ref_id), None) if ref_id else None


def all_references() -> list[Reference]:
    return list(_table().values())


BEST_SHAPE_COLUMNS = ("mamf_bf16_shape", "mamf_fp8_shape")


def best_shapes(name: str | None) -> list[tuple[int, int, int]]:
    """The (m, n, k) at which mamf-finder measured the best figures the judge holds this model to
    (a MIG slice's name, "NVIDIA A100-SXM4-80GB MIG 1g.10gb", counts as its GPU's): a sweep meant
    to reach those figures must try their shapes."""
    ref = match(re.sub(r"\s+MIG\s+\S+$", "", name or ""))
    if ref is None:
        return []
    shapes = []
    for column in BEST_SHAPE_COLUMNS:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", (ref.row.get(column) or "").strip())
        if m:
            shapes.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    return shapes
