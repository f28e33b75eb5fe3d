"""`gpuvet compare --md` puts run names, labels and GPU names (anyone's words: a record from another
machine, a label typed by a colleague) into Markdown: rendered, none of them may become HTML, an
image or a link (8 of 22 payloads did, issue 30). Rendered with markdown-it (CommonMark, with raw
HTML on, as GitHub-like renderers show it before their own sanitising)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from cli_runner import gpuvet

RECORDS = Path(__file__).parent / "fixtures" / "records"
PAYLOADS = [
    "<img src=x onerror=alert(1)>", "<script>alert(1)</script>", "![](http://127.0.0.1:9/pixel.png)",
    "[click](javascript:alert(1))", "<javascript:alert(1)>", "<a href='javascript:alert(1)'>x</a>",
    "<iframe src=//evil>", "<svg onload=alert(1)>", "[x][1]\n\n[1]: javascript:alert(1)", "# heading",
    "a | b | c", "**bold** _it_", "`code <b>`", "<details open ontoggle=alert(1)>", "&lt;script&gt;",
    "<!-- comment -->", "<style>*{display:none}</style>", "[x](data:text/html;base64,PHNjcmlwdD4=)",
    "<http://127.0.0.1:9/auto>", "\u202eevil", "line\n- list\n> quote", "<b onmouseover=alert(1)>hover</b>",
]
DANGEROUS = ("<script", "<img", "<iframe", "<svg", "<a href", "<details", "<style", "<b ",
             'href="javascript', 'href="data', 'src="http')


@pytest.mark.parametrize("payload", PAYLOADS)
def test_names_and_labels_stay_text_in_compare_markdown(capsys, tmp_path, payload):
    files = []
    for n, name in enumerate(("h100-8x-throttle", "gtx1070-6x-x1-riser")):
        record = json.loads((RECORDS / f"{name}.json").read_text())
        record["options"]["label"] = f"{payload} run {n}"
        record["machine"]["gpus"][0]["name"] = f"{payload} GPU"
        path = tmp_path / f"{name}-edited-payload.json"
        path.write_text(json.dumps(record))
        files.append(str(path))
    code, out, err = gpuvet(capsys, "compare", *files, "--md", "-v")
    assert code == 0, err
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(out)
    assert not any(bad in html.lower() for bad in DANGEROUS), html[:2000]
    assert "\u202e" not in out
