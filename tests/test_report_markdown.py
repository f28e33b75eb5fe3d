"""The Markdown report, parsed by a real Markdown parser (markdown-it, which rich ships with)."""

from __future__ import annotations

import json
from pathlib import Path

from markdown_it import MarkdownIt

from gpuvet import runner
from gpuvet.record import FAIL, WARN, Finding, RunRecord
from gpuvet.report.markdown import cell, render_markdown, text
from gpuvet.report.redact import redact

FIXTURES = Path(__file__).parent / "fixtures"
RECORDS = FIXTURES / "records"


def record(name: str) -> RunRecord:
    return RunRecord.from_dict(json.loads((RECORDS / f"{name}.json").read_text()))


def tables(markdown: str) -> list[list[list[str]]]:
    """Every table as rows of cell texts, the way a GFM renderer splits them."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    found, row = [], None
    for token in tokens:
        if token.type == "table_open":
            found.append([])
        elif token.type == "tr_open":
            row = []
        elif token.type == "inline" and row is not None:
            row.append(token.content)
        elif token.type == "tr_close":
            found[-1].append(row)
            row = None
    return found


def test_checklist_tables_parse_with_one_row_per_item_and_three_cells():
    md = render_markdown(record("gtx1070-6x-x1-riser"))
    acceptance, hidden = tables(md)[:2]
    assert acceptance[0] == ["", "Item", "What decided it"] and len(acceptance) == 1 + 8 and len(hidden) == 1 + 6
    assert all(len(row) == 3 for row in acceptance + hidden)
    pcie = next(row for row in acceptance if row[1] == "PCIe width and generation under load")
    assert pcie[0] == "❌ no" and pcie[2].startswith("gpu0: x1 of x16 lanes: host<->GPU bandwidth")


def test_verdict_first_and_every_problem_with_its_evidence_and_remedy():
    r = record("h100-8x-throttle")
    md = render_markdown(r)
    assert md.startswith("# gpuvet: FAIL: something is wrong with this machine\n\n**❌ FAIL** (1 failed, 1 warnings")
    for f in r.findings:
        if f.status in (FAIL, WARN):
            assert f"`{f.check}` {f.subject}" in md
            assert f"- **Fix / confirm:** {f.remedy}" in md
            assert f"- **Measured:** {f.evidence.measured}" in md
    assert md.index("### ❌ FAIL `gpu.throttle`") < md.index("### ⚠️ WARN `gpu.isolation`") < md.index("## GPUs")


def test_passes_and_measurements_are_tables():
    md = render_markdown(record("h100-8x-synthetic-sustained"))
    found = tables(md)
    passed = next(t for t in found if t[0] == ["Status", "Area", "Check", "Subject", "Summary"])
    assert ["✅ PASS", "GPU", "`gpu.ecc`", "gpu0-7", "ECC on, no uncorrectable errors"] in passed
    measured = next(t for t in found if t[0] == ["Measurement", "Values", "Unit"])
    assert measured[1][0] == "`sustained.tflops`" and measured[1][1].startswith("gpu0 655.2, gpu1 655.9, gpu2 398.3")


def test_pipes_and_html_in_findings_cannot_break_the_page():
    r = record("cpu-quick")  # synthetic finding: a summary with a pipe and something that looks like HTML
    r.findings.append(Finding("storage.read", "/data", FAIL, "read 12 MB/s | <script>alert(1)</script> on `a|b`",
                              remedy="fio --name=x | tee <log>"))
    md = render_markdown(r)
    row = next(row for t in tables(md) for row in t if row[1] == "Local disk and shared storage IO")
    assert len(row) == 3 and row[2] == "read 12 MB/s | &lt;script>alert(1)&lt;/script> on `a|b`; tested /data"
    assert "<script>" not in md
    assert text("host<->GPU `<b>`") == "host<->GPU `<b>`"
    assert cell("a\nb | c") == "a b \\| c"


def test_the_gpus_table_names_each_card_the_way_a_provider_finds_it():
    r = record("h100-8x-throttle")
    gpus = next(t for t in tables(render_markdown(r)) if t[0][:6] == ["GPU", "Model", "Bus ID", "UUID", "Serial", "VBIOS"])
    assert len(gpus) == 1 + 8 and all(len(row) == 13 for row in gpus)
    gpu2 = gpus[3]
    g = r.machine.gpus[2]
    assert gpu2[:6] == ["gpu2", "NVIDIA H100 80GB HBM3", g.pcie.bus_id, g.uuid, g.serial, g.vbios]
    assert gpu2[7] == "700 W (default 700)" and gpu2[8] == "Gen5 x16 of Gen5 x16 (nvidia-smi)"


def test_redacted_markdown_keeps_the_bus_id_but_not_uuids_or_serials():
    r = record("h100-8x-throttle")
    shared = render_markdown(redact(r))
    for g in r.machine.gpus:
        assert g.uuid not in shared and g.serial not in shared
        assert f"| gpu{g.index} | NVIDIA H100 80GB HBM3 | {g.pcie.bus_id} | GPU-REDACTED-" in shared
    assert "SERIAL-REDACTED-" in shared


def test_identical_problems_of_several_gpus_are_one_block():
    r = runner.inspect([str(FIXTURES / "smi_xml/gtx-1070-x6-riser-pcie-x1-384.66-v9.xml")])
    md = render_markdown(r)
    assert md.count("### ❌ FAIL `gpu.pcie_link`") == 2  # gpu0 is Gen3, gpu1-5 are Gen2: two different problems
    block = md[md.index("### ❌ FAIL `gpu.pcie_link` gpu1-5"):].split("\n\n### ")[0]
    assert "x1 of x16 lanes" in block
    # The remedy differs only by index and bus ID: said once, pointing at the GPUs table.
    assert "`nvidia-smi -i N -q -d PCIE`" in block and "`sudo lspci -vv -s BUS_ID" in block
    assert "(N: the GPU's index, BUS_ID: its bus ID in the GPUs table)" in block
    assert "### ❌ FAIL `gpu.pcie_link` gpu2" not in md


def test_the_machine_section_names_the_host_os_and_kernel_and_redact_hides_the_host():
    markdown = render_markdown(record("cpu-quick"))
    assert ("- System: host gpu-node-17.example.internal · OS Debian GNU/Linux 12 (bookworm) · kernel 6.18.44-fc-v657"
            in markdown)
    redacted = render_markdown(redact(record("cpu-quick")))
    assert "gpu-node-17" not in redacted and "- System: host HOST-REDACTED-1 · OS Debian" in redacted
