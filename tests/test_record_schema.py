"""`gpuvet schema KIND` prints the JSON Schema of each record kind, shipped in the package and made
from the types the loader checks; every fixture record and every record the tests write match it
(conftest checks the latter after each test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli_runner import gpuvet
from conftest import _WRITTEN
from gpuvet.record import STATUSES
from gpuvet.record.schema import DEFS, KINDS, files, shipped, shipped_file, text
from record_schemas import problems

FIXTURES = Path(__file__).parent / "fixtures"
RECORDS = sorted((FIXTURES / "records").glob("*.json"))


@pytest.mark.parametrize("kind", KINDS)
def test_the_shipped_schema_is_the_one_the_types_make(kind):
    assert shipped(kind) == text(kind), (
        "a record type changed (a facts field, a status, a benchmark's details): refresh the shipped "
        "schemas with `PYTHONPATH=src python -m gpuvet.record.schema --write` and commit them")


def test_the_package_ships_each_definition_once():
    # One file of shared definitions and a small root per kind (three self-contained copies were
    # 243 KB of the wheel); every file is the one the types make.
    for name, content in files().items():
        assert shipped_file(name) == content, f"{name}.schema.json is stale: python -m gpuvet.record.schema --write"
    assert all(len(shipped_file(kind)) < 1000 for kind in KINDS)
    assert sum(len(shipped_file(name)) for name in (*KINDS, DEFS)) < 120_000


@pytest.mark.parametrize("kind", KINDS)
def test_gpuvet_schema_prints_it(capsys, kind):
    code, out, err = gpuvet(capsys, "schema", kind)
    printed = json.loads(out)  # self-contained: every reference it holds is to its own definitions
    assert code == 0 and printed["$id"].endswith(f"/{kind}.schema.json")
    refs = {ref for ref in re.findall(r'"\$ref": "([^"]+)"', out)}
    assert refs and all(ref.startswith("#/$defs/") and ref[8:] in printed["$defs"] for ref in refs)


def test_an_unknown_kind_is_exit_2(capsys):
    code, out, err = gpuvet(capsys, "schema", "nodes")
    assert code == 2 and "run" in err and "cluster" in err


def test_the_status_list_is_the_schemas():
    finding = json.loads(shipped("run"))["$defs"]["Finding"]
    assert finding["properties"]["status"]["enum"] == list(STATUSES)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_every_fixture_record_matches_the_run_schema(path):
    assert problems("run", json.loads(path.read_text())) == []


def test_an_export_of_the_fixtures_matches_the_export_schema():
    assert problems("export", [json.loads(p.read_text()) for p in RECORDS]) == []


def test_the_schema_refuses_what_the_loader_refuses():
    record = json.loads(RECORDS[0].read_text())
    record["machine"]["captures"] = [{"path": "smi.xml"}]  # a capture entry without its kind
    record["findings"][0]["status"] = "excellent"
    record["measurements"].append({"name": "disk.seq_read", "value": 1.0, "unit": "MB/s", "subject": "host",
                                   "details": {"read_mb_s": [1, 2]}})
    found = " ".join(problems("run", record))
    assert "'kind' is a required property" in found and "'excellent' is not one of" in found
    assert "[1, 2] is not valid" in found or "is not of type" in found


def test_records_written_while_testing_are_collected_for_the_schema_check(capsys):
    xml = sorted((FIXTURES / "smi_xml").glob("*.xml"))[0]
    code, out, err = gpuvet(capsys, "inspect", str(xml), "--json")
    assert code in (0, 1), err
    assert any(kind == "run" for kind, _ in _WRITTEN)  # checked against the schema when this test ends


def test_a_watch_log_line_and_a_cluster_record_match_theirs():
    header = {"schema": "gpuvet.watch/1", "kind": "header", "t0": 1.0, "interval_s": 1.0,
              "series": {"host": {"name": "watch.host", "columns": ["t", "cpu_pct"]}}}
    assert problems("watch", header) == [] and problems("watch", {"subject": "host", "row": [0.0, 1.5]}) == []
    assert problems("watch", {**header, "t0": "yesterday"})
    cluster = {"schema": "gpuvet.cluster/1", "nodes": [{"name": "a", "rank": 0, "record": json.loads(RECORDS[0].read_text())}]}
    assert problems("cluster", cluster) == []
    cluster["nodes"][0]["rank"] = "first"
    assert problems("cluster", cluster)


def test_a_plan_matches_the_plan_schema(capsys):
    # This machine's plan (no GPU: its GPU steps skipped, saying why) and an 8x H100 capture's.
    code, out, _ = gpuvet(capsys, "run", "--plan", "--json")
    assert code == 0 and problems("plan", json.loads(out)) == []
    capture = FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"
    code, out, _ = gpuvet(capsys, "inspect", str(capture), "--plan", "--json")
    plan = json.loads(out)
    assert code == 0 and problems("plan", plan) == [] and plan["target_s"] == 120
    assert plan["gpus"] == [0, 1, 3, 4, 5, 6, 7] and any("gpu2" in note for note in plan["notes"])  # someone's process on gpu2
    broken = {**plan, "steps": [{**plan["steps"][0], "budget_s": "soon"}]}
    assert problems("plan", broken)  # the schema refuses what the plan never holds
