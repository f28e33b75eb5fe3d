"""Text gpuvet did not write (a capture's GPU name, a record's hostname or label, a store row)
reaches no renderer with escape sequences or control characters in it, and cannot inject
Markdown headings or images. The edited inputs are built here from real fixtures."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from markdown_it import MarkdownIt

from cli_runner import gpuvet
from gpuvet.record import RunRecord
from gpuvet.report.markdown import render_markdown
from gpuvet.untrusted_text import clean, clean_strings

FIXTURES = Path(__file__).parent / "fixtures"
RTX3090_XML = FIXTURES / "smi_xml/rtx-3090-swpowercap-590.44.01-v13.xml"
RECORD = FIXTURES / "records/h100-8x-throttle.json"
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x1bc\u202e\x9b31m\r"


def test_escape_sequences_controls_and_bidi_overrides_are_removed_and_lines_kept():
    assert clean(f"NVIDIA{HOSTILE} H100") == "NVIDIA H100"
    assert clean("a\tb\nc\ud800") == "a\tb\nc\ufffd"  # a lone surrogate cannot be printed
    nested = clean_strings({"host\x1b[1m": ["x\x07", {"k": "\x1bc"}]})
    assert nested == {"host": ["x", {"k": ""}]}


def test_a_capture_with_escapes_in_its_gpu_name_prints_none_of_them(capsys, tmp_path):
    xml = tmp_path / "rtx-3090-edited-escapes.xml"
    xml.write_text(RTX3090_XML.read_text().replace("NVIDIA GeForce RTX 3090", f"NVIDIA GeForce{HOSTILE} RTX 3090"))
    code, out, err = gpuvet(capsys, "inspect", str(xml))
    assert code in (0, 1) and "NVIDIA GeForce RTX 3090" in out
    assert "\x1b" not in out + err and "\x9b" not in out and "\u202e" not in out and "\r" not in out


def hostile_record(tmp_path: Path) -> Path:
    data = json.loads(RECORD.read_text())
    data["machine"]["gpus"][0]["name"] = f"H100{HOSTILE}\n# Pwned\n![x](http://example.invalid/p.png)"
    data["machine"]["host"] = {**(data["machine"].get("host") or {}), "hostname": f"node{HOSTILE}1"}
    data["options"]["label"] = "lab\x1b[31mel"
    path = tmp_path / "h100-edited-escapes.json"
    path.write_text(json.dumps(data))
    return path


def test_a_record_file_with_escapes_shows_none_in_report_or_history(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUVET_DB", str(tmp_path / "runs.sqlite3"))
    path = hostile_record(tmp_path)
    for argv in (("report", str(path)), ("import", str(path)), ("history",), ("show", "1")):
        code, out, err = gpuvet(capsys, *argv)
        assert code in (0, 1) and "\x1b" not in out + err and "\u202e" not in out + err, argv


def test_a_store_row_edited_with_escapes_is_listed_clean(capsys, tmp_path, monkeypatch):
    db = tmp_path / "runs.sqlite3"
    monkeypatch.setenv("GPUVET_DB", str(db))
    gpuvet(capsys, "import", str(RECORD))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET label = ?, hostname = ?", ("\x1b]0;owned\x07lab", "\x1b[2Jnode"))
    code, out, err = gpuvet(capsys, "history")
    assert code == 0 and "\x1b" not in out + err and "lab" in out


def test_newlines_in_a_field_inject_no_markdown_heading_or_image(tmp_path):
    record = RunRecord.from_dict(json.loads(hostile_record(tmp_path).read_text()))
    tokens = MarkdownIt("commonmark").enable("table").parse(render_markdown(record))
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert "Pwned" not in " ".join(headings)
    images = [c for t in tokens if t.children for c in t.children if c.type == "image"]
    assert images == []
