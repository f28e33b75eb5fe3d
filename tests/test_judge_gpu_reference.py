"""The reference table is matched on exact NVML names: every row by its own name, no row by a
variant's name or a name cut off by the nvidia-smi table when more than one model fits."""

from __future__ import annotations

import pytest

from gpuvet.specs import reference

ROWS = reference.all_references()


@pytest.mark.parametrize("ref", ROWS, ids=[r.id for r in ROWS])
def test_every_row_matches_its_own_nvml_name(ref):
    name = reference.primary_name(ref.row)
    assert "(" not in name
    assert reference.match(name) is ref


def test_h800_matches_without_the_note_in_its_cell_and_its_variants_do_not_inherit_it():
    assert reference.match("NVIDIA H800").id == "H800 (SXM)"  # the cell says "NVIDIA H800 (SXM)"
    assert reference.match("NVIDIA H800 PCIe") is None
    assert reference.match("NVIDIA H20-3e") is None and reference.match("NVIDIA H20").id == "H20"


def test_cut_off_name_matches_only_one_fitting_model():
    assert reference.match("Tesla V100-SXM2...") is None  # 16 GB or 32 GB
    assert reference.match("Tesla V100-SXM2...", 32510).id == "V100-SXM2-32GB"
    assert reference.match("NVIDIA GeForce ...", 23028) is None
    assert [r.id for r in reference.truncated_candidates("NVIDIA GeForce ...", 23028)] == ["RTX-3090", "RTX-4090", "RTX-4090D"]
