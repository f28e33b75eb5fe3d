"""Bad records end in one line and exit 2 everywhere (report, inspect, import, compare), never a
traceback; a record that `import` stores is one `show` renders. Each case is a real fixture
record edited in memory the way a damaged or hostile file would be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import gpuvet
from gpuvet.record import RecordError
from gpuvet.record.load import CLUSTER, EXPORT, RUN, WATCH, load

RECORDS = Path(__file__).parent / "fixtures" / "records"
H100 = RECORDS / "h100-bundle-nvlink.json"  # from a capture bundle: GPUs, captures, no series
SUSTAINED = RECORDS / "cpu-sustained.json"  # a CPU run with a throughput series


def _record(path: Path = H100) -> dict:
    return json.loads(path.read_text())


def _bad_records() -> dict[str, tuple[str, str]]:
    """name -> (the file's text, words the one line must hold)."""
    cases = {}
    gpu_name_list = _record()
    gpu_name_list["machine"]["gpus"][0]["name"] = ["NVIDIA H100"]
    cases["a list where a name belongs"] = (json.dumps(gpu_name_list), "machine.gpus[0].name: a list where a text belongs")
    value_list = _record(SUSTAINED)
    value_list["measurements"][0]["value"] = [1, 2]
    cases["a list where a number belongs"] = (json.dumps(value_list), "measurements[0].value: a list where a number belongs")
    huge = json.dumps(_record()).replace('"memory_total_mib": 81559', '"memory_total_mib": 1' + "0" * 400, 1)
    assert "0" * 400 in huge
    cases["a number too large for a float"] = (huge, "too large")
    no_kind = _record()
    no_kind["machine"]["captures"] = [{"path": "smi.xml"}]
    cases["a capture entry without its kind"] = (json.dumps(no_kind), "machine.captures[0]: without kind")
    deep = json.dumps(_record()).replace('"options": {}', '"options": ' + "[" * 100_000 + "]" * 100_000, 1)
    assert "[" * 100_000 in deep
    cases["100,000-deep nesting"] = (deep, "nested too deeply")
    status = _record()
    status["findings"][0]["status"] = "excellent"
    cases["a status gpuvet does not know"] = (json.dumps(status), "'excellent' is not one of pass")
    cases["a JSON list that holds the cluster schema"] = ('["gpuvet.cluster/1"]', "item 1 of 1 is not a gpuvet run record")
    return cases


BAD = _bad_records()


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("command", ["report", "inspect", "import", "compare"])
def test_a_bad_record_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch, case, command):
    monkeypatch.setenv("GPUVET_DB", str(tmp_path / "runs.sqlite3"))
    text, words = BAD[case]
    path = tmp_path / "run.json"
    path.write_text(text)
    argv = {"report": ["report", str(path)], "inspect": ["inspect", str(path)], "import": ["import", str(path)],
            "compare": ["compare", str(path), str(H100)]}[command]
    code, out, err = gpuvet(capsys, *argv)
    assert code == 2, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    if command == "inspect" and not text.lstrip().startswith("{"):
        words = "not a capture gpuvet knows"  # inspect reads a file that is no run record as a capture
    assert words in err and str(path) in err, err
    if command == "import":  # all or none: nothing was stored
        assert gpuvet(capsys, "history")[1].count("H100") == 0


def test_nan_and_infinity_in_series_rows_are_readings_not_known(capsys, tmp_path):
    record = _record(SUSTAINED)
    rows = record["series"][0]["rows"]
    rows[0][1], rows[1][1] = float("nan"), float("inf")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))  # json writes them as NaN and Infinity, as Python's json reads them
    assert "NaN" in path.read_text() and "Infinity" in path.read_text()
    html = tmp_path / "run.html"
    code, _, err = gpuvet(capsys, "report", str(path), "--format", "html", "--out", str(html))
    assert code in (0, 1) and "Traceback" not in err
    assert "<svg" in html.read_text() or "<img" in html.read_text()  # the throughput plot is drawn
    loaded = load(str(path)).runs()[0]
    assert loaded.series[0]["rows"][0][1] is None and loaded.series[0]["rows"][1][1] is None


def test_a_lone_surrogate_in_a_text_is_shown_replaced(capsys, tmp_path):
    text = json.dumps(_record()).replace('"name": "NVIDIA H100 80GB HBM3"', '"name": "NVIDIA \\ud800 H100"', 1)
    assert "\\ud800" in text
    path = tmp_path / "run.json"
    path.write_text(text)
    code, out, err = gpuvet(capsys, "report", str(path), "--format", "md")
    assert code in (0, 1) and "Traceback" not in err
    assert "\ud800" not in out


def test_import_stores_only_what_show_renders(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUVET_DB", str(tmp_path / "runs.sqlite3"))
    record = _record(SUSTAINED)
    record["series"][0]["rows"][0][1] = float("nan")
    path = tmp_path / "export.json"
    path.write_text(json.dumps([record, _record()]))
    code, out, err = gpuvet(capsys, "import", str(path))
    assert code == 0, err
    for run_id in ("1", "2"):
        code, out, err = gpuvet(capsys, "show", run_id)
        assert code in (0, 1) and "Traceback" not in err and out


def _watch_log(tmp_path: Path, **header_fields) -> Path:
    header = {"schema": "gpuvet.watch/1", "kind": "header", "gpuvet": "0.1.0", "hostname": "node", "t0": 1700000000.0,
              "interval_s": 1.0, "series": {"host": {"name": "watch.host", "columns": ["t", "cpu_pct"]}}}
    header.update(header_fields)
    path = tmp_path / "watch.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps({"subject": "host", "row": [0.0, 12.5]}) + "\n")
    return path


@pytest.mark.parametrize("fields, words", [
    ({"t0": "yesterday"}, "t0: a text where a number belongs"),
    ({"series": ["host"]}, "series: a list where an object belongs"),
    ({"interval_s": None}, "interval_s: null where a number belongs"),
    ({"hostname": {"name": "node"}}, "hostname: an object where a text belongs"),
])
def test_a_watch_log_header_of_the_wrong_type_is_one_line_and_exit_2(capsys, tmp_path, fields, words):
    path = _watch_log(tmp_path, **fields)
    code, out, err = gpuvet(capsys, "report", str(path))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert words in err and "line 1" in err, err


def test_a_cluster_record_of_the_wrong_type_is_one_line_and_exit_2(capsys, tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"schema": "gpuvet.cluster/1", "nodes": [{"name": "a", "rank": "first"}]}))
    code, out, err = gpuvet(capsys, "report", str(path))
    assert code == 2 and "Traceback" not in err, err
    assert "nodes[0].rank: a text where a whole number belongs" in err


def test_the_loader_tells_the_kinds_apart(tmp_path):
    assert load(str(H100)).kind == RUN
    export = tmp_path / "export.json"
    export.write_text(json.dumps([_record(), _record(SUSTAINED)]))
    assert load(str(export)).kind == EXPORT and len(load(str(export)).runs()) == 2
    assert load(str(_watch_log(tmp_path))).kind == WATCH
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"schema": "gpuvet.cluster/1", "nodes": []}))
    assert load(str(cluster)).kind == CLUSTER
    with pytest.raises(RecordError, match="a gpuvet cluster record; a gpuvet run record .* is needed"):
        load(str(cluster), (RUN, EXPORT))
    for text, words in (("", "not JSON"), ("{}", "an object without a schema"), ("[]", "an empty gpuvet export"),
                        ('{"schema": "gpuvet.watch/1"}', "one line of a gpuvet watch log")):
        other = tmp_path / "other.json"
        other.write_text(text)
        with pytest.raises(RecordError, match=words):
            load(str(other))


def test_every_fixture_record_loads():
    for path in sorted(RECORDS.glob("*.json")):
        assert load(str(path)).runs(), path


def test_a_rows_values_are_checked_one_by_one():
    from gpuvet.record.validate import check

    row = [0.5, 3, None, "idle", True, float("nan"), float("inf")]
    assert check(row, list[float | str | bool | None], "rows[0]") == [0.5, 3, None, "idle", True, None, None]
    assert check([1, 2.0], list[int], "gpus") == [1, 2.0]
    for bad, words in (([1, 2.5], "gpus[1]: 2.5 where a whole number belongs"), ([1, [2]], "gpus[1]: a list where"),
                       ([True], "gpus[0]: true/false where"), ([2**70], "gpus[0]: a number too large")):
        with pytest.raises(RecordError, match=words.replace("[", r"\[").replace("]", r"\]")):
            check(bad, list[int], "gpus")
