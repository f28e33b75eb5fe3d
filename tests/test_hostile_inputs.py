"""The classes a fuzzer found over every file-taking command (issue 30), each with the smallest
input it found or one built the same way from a real fixture: a record or one clean line (exit 2),
never a traceback; no piece of anyone else's text that drives the terminal; no "one line" of
200 KB. Edited inputs are built here and named `-edited-` when written.
"""

from __future__ import annotations

import json
import time
import re
from pathlib import Path

import pytest

from cli_runner import gpuvet
from gpuvet.untrusted_text import LINE_CHARACTERS, clean, one_line, quote

FIXTURES = Path(__file__).parent / "fixtures"
HUGE = "1" * 5000  # int() refuses past 4300 digits; a float of it is inf
LONG = "7" * 600


def clean_outcome(code: int, out: str, err: str, what: str) -> None:
    """A record (exit 0/1) or exactly one clean line on stderr (exit 2); never a traceback."""
    assert "Traceback" not in err and "Error:" not in err.split("gpuvet:")[0], (what, err[-500:])
    assert code in (0, 1, 2), (what, code, err[-300:])
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuvet"), (what, err[-300:])
        assert clean(lines[0]) == lines[0] and len(lines[0]) <= 2 * LINE_CHARACTERS, (what, lines[0][:200])
    else:
        json.loads(out)


def inspect(capsys, tmp_path: Path, name: str, text: str) -> tuple[int, str, str]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = gpuvet(capsys, "inspect", str(path), "--json")
    clean_outcome(*result, name)
    return result


# -- tracebacks -------------------------------------------------------------------------------

def test_a_dmon_capture_cut_inside_its_second_header_line_is_one_line(capsys, tmp_path):
    # The smallest of 61 fuzzed inputs: an IndexError where the loop's note counted its samples.
    code, _, err = inspect(capsys, tmp_path, "dmon-edited-cut-in-header.txt", "# gpu    pwr  gtemp\n# Idx      W")
    assert code == 2 and "no complete sample row" in err


@pytest.mark.parametrize("fixture, old, new", [
    ("smi_text/q-titan-v-560.35.03.txt", "Replays Since Reset               : 0", f"Replays Since Reset : {HUGE}"),
    ("smi_text/q-titan-v-560.35.03.txt", "Attached GPUs                             : 1", f"Attached GPUs : {HUGE}"),
    ("smi_xml/rtx-3080-595.58.03-v13.xml", "<attached_gpus>1</attached_gpus>", f"<attached_gpus>{HUGE}</attached_gpus>"),
    ("smi_xml/rtx-3080-595.58.03-v13.xml", "<retired_count>N/A</retired_count>", f"<retired_count>{HUGE}</retired_count>"),
    ("smi_text/nvlink-status-8x-a100-sxm4.txt", "GPU 0:", f"GPU {LONG}:"),
    ("smi_text/nvlink-status-8x-a100-sxm4.txt", "Link 1: 25 GB/s", f"Link {HUGE}: {HUGE} GB/s"),
    ("smi_text/nvlink-errors-gb300-one-link-srt-slurm-docs.txt", "Replay Errors: 0", f"Replay Errors: {HUGE}"),
    ("smi_text/nvlink-errors-gb300-one-link-srt-slurm-docs.txt", "Link 0: CRC", f"Link {HUGE}: CRC"),
    ("smi_text/default-table-h100-vm-590.48.01.txt", "|                    0 |", f"| {HUGE} |"),
    ("smi_text/default-table-h100-vm-590.48.01.txt", "|   0  NVIDIA", f"|   {LONG}  NVIDIA"),
    ("topo/puget-wrx90-2x-rtx6000ada-phb-spaces.txt", "GPU1", f"GPU{LONG}"),
    ("topo/puget-wrx90-2x-rtx6000ada-phb-spaces.txt", "PHB ", f"NV{HUGE} "),
    ("lspci/lspci-vvv-rtx6000ada-idle-gen1-downgraded-spaces.txt", "Width x16", f"Width x{HUGE}"),
    ("lspci/lspci-vvv-rtx6000ada-idle-gen1-downgraded-spaces.txt", "Speed 16GT/s", "Speed 1.2.3GT/s"),
    ("smi_text/dmon-h100-vm-idle-590.48.01.txt", "    0 ", f"    0x{'f' * 5000} "),
])
def test_numbers_of_thousands_of_digits_are_no_reading_not_a_traceback(capsys, tmp_path, fixture, old, new):
    """OverflowError / "Exceeds the limit (4300 digits)" in seven parsers: each reads numbers
    through one bounded reader (values.whole / values.number)."""
    text = (FIXTURES / fixture).read_text()
    assert old in text
    inspect(capsys, tmp_path, f"{Path(fixture).stem}-edited-huge-number{Path(fixture).suffix}", text.replace(old, new, 1))


def test_a_line_separator_inside_an_nvidia_smi_error_line_is_one_line(capsys, tmp_path):
    # StopIteration: splitlines() ends a line at U+2028 where the regular expression does not.
    code, _, err = inspect(capsys, tmp_path, "error-edited-u2028.txt", "ERROR: Unable\u2028 to find the GPU\n")
    assert code == 2 and "\u2028" not in err
    text = (FIXTURES / "smi_text/error-nvml-driver-library-mismatch.txt").read_text()
    code, _, err = inspect(capsys, tmp_path, "mismatch-edited-u2028.txt", text.replace("NVML:", "NVML:\u2028", 1))
    assert code == 2


# -- other people's text in one-line messages --------------------------------------------------

@pytest.mark.parametrize("argv", [["inspect"], ["inspect", "--json"], ["report"], ["report", "--format", "md"],
                                  ["import"], ["doctor", "slower-and-slower", "--run"], ["node-labels"], ["health", "--no-save", "--from"]])
def test_a_file_name_with_escapes_and_bidi_reaches_no_terminal_raw(capsys, tmp_path, argv):
    name = "x\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[31mred\u202e\x9b31m.xml"
    path = tmp_path / name
    path.write_bytes(b"\x1b[2Jnot a capture\n")
    code, out, err = gpuvet(capsys, *argv, str(path))
    assert code == 2 and out == ""
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", err), repr(err)
    assert len(err.strip().splitlines()) == 1 and "xred.xml" in err  # the name, without what drives the terminal


def test_a_200000_character_json_value_is_not_a_200_kb_line(capsys, tmp_path):
    record = json.loads((FIXTURES / "records/cpu-quick.json").read_text())
    record["duration_s"] = "A" * 200_000  # a text where a number belongs: refused, quoting the value
    path = tmp_path / "cpu-quick-edited-huge-value.json"
    path.write_text(json.dumps(record))
    for argv in (["report", str(path)], ["import", str(path)], ["inspect", str(path)]):
        code, out, err = gpuvet(capsys, *argv)
        clean_outcome(code, out if code != 2 else "{}", err, str(argv))
        assert max(len(line) for line in err.splitlines()) <= 2 * LINE_CHARACTERS


def test_quote_and_one_line_cut_and_clean():
    assert quote("a" * 300).endswith("... (180 more characters)") and len(quote("a" * 300)) < 160
    assert quote("x\x1b]0;t\x07y\u202e\nz") == "'xy z'"
    message = one_line("gpuvet: " + "q" * 200_000 + " end")
    assert len(message) < LINE_CHARACTERS + 60 and message.startswith("gpuvet: qqq") and message.endswith(" end")
    assert one_line("gpuvet: a\nb\x9b31mc") == "gpuvet: a bc"  # U+009B: a CSI, taken out whole


@pytest.mark.parametrize("argv", [["inspect", "--json"], ["report", "--format", "md"], ["node-labels"]])
def test_an_export_whose_first_run_is_broken_is_one_line_not_two(capsys, tmp_path, argv):
    """The "holds 2 runs; this is the first" note came before the refusal of that run: two lines."""
    runs = [json.loads((FIXTURES / f"records/{name}.json").read_text()) for name in ("h100-8x-throttle", "cpu-quick")]
    runs[0]["machine"]["gpus"][1]["clocks"] = 7
    path = tmp_path / "export-edited-broken-first.json"
    path.write_text(json.dumps(runs))
    code, _, err = gpuvet(capsys, argv[0], str(path), *argv[1:])
    assert code == 2 and err.strip().splitlines() == [f"gpuvet: {path}: item 1 of 1: machine.gpus[1].clocks: a number where an object belongs"]


def test_a_q_report_nested_thousands_deep_is_read_not_a_recursion_error(capsys, tmp_path):
    """Found by this round's re-check: each line one space deeper than the last made the check for
    a cut report recurse 5,000 deep (RecursionError)."""
    text = "==============NVSMI LOG==============\nAttached GPUs : 1\nGPU 00000000:01:00.0\n"
    inspect(capsys, tmp_path, "q-edited-deep.txt", text + "".join(" " * i + f"L{i}\n" for i in range(1, 5000)))


def test_xml_nested_a_million_deep_is_refused_before_a_tree_is_built(capsys, tmp_path):
    """16 s and 340 MB to build and free the tree; refused by one scan of the tags now."""
    text = '<?xml version="1.0" ?>\n<nvidia_smi_log>' + "<d>" * 1_000_000 + "</d>" * 1_000_000 + "</nvidia_smi_log>"
    code, _, err = inspect(capsys, tmp_path, "xml-edited-deep.xml", text)
    assert code == 2 and "nested more than 64 deep" in err


@pytest.mark.parametrize("fixture, old", [
    ("smi_text/q-titan-v-560.35.03.txt", "TITAN V"),
    ("smi_xml/rtx-3080-595.58.03-v13.xml", "NVIDIA GeForce RTX 3080"),
    ("smi_text/default-table-h100-vm-590.48.01.txt", "NVIDIA H100 80GB HBM3"),
    ("smi_text/nvlink-status-8x-a100-sxm4.txt", "NVIDIA A100-SXM4-80GB"),
])
def test_a_gpu_name_of_ten_thousand_characters_makes_no_line_over_2000(capsys, tmp_path, fixture, old):
    """A 10,000-character name made a 10 KB line in every report; a capture's text values are cut
    at values.MAX_TEXT (saying how many characters more there were)."""
    text = (FIXTURES / fixture).read_text()
    assert old in text
    path = tmp_path / f"{Path(fixture).stem}-edited-long-name{Path(fixture).suffix}"
    before, _, after = text.rpartition(old)  # the last: a first line that long is no capture's first line
    path.write_text(before + "NVIDIA " + "V" * 10_000 + after)
    code, out, err = gpuvet(capsys, "inspect", str(path), "-v")
    assert code in (0, 1) and "more characters" in out, err
    assert max(len(line) for line in out.splitlines()) <= 2000
    record = tmp_path / "record.json"
    gpuvet(capsys, "inspect", str(path), "--json", "--out", str(record))
    code, out, _ = gpuvet(capsys, "report", str(record), "--format", "md")
    assert max(len(line) for line in out.splitlines()) <= 2000


def test_a_day_long_query_loop_is_read_in_seconds_and_thinned(tmp_path):
    """A --query-gpu loop of 17,000 rows of ~200 fields (26 MB: a day of `-l 5`) took 15 s, most
    of it building every field of every row and judging and writing 17,000 samples. Rows keep
    only the fields a sample reads, and a GPU's series keeps 2,000 evenly spaced samples, saying so.
    Built from the real loop capture (edited: its rows repeated)."""
    from gpuvet.probe import capture, smi_series

    lines = (FIXTURES / "edited/csv-h100-load-590.48.01-edited-indexed-loop-l5-heating.csv").read_text().splitlines(keepends=True)
    path = tmp_path / "csv-h100-load-edited-17000-rows.csv"
    path.write_text(lines[0] + "".join(lines[1:]) * (17_000 // (len(lines) - 1)))
    start = time.monotonic()
    [loop] = capture.read_captures(str(path))
    assert time.monotonic() - start < 10
    [samples] = loop.series.values()
    assert len(samples) <= smi_series.MAX_SAMPLES + 1 and "evenly spaced" in loop.note
