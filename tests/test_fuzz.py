"""A seeded fuzzer over gpuvet's inputs: mutated real captures (`inspect`) and mutated run
records (`report`, `import`, `show`). Every input must end with a record (exit 0/1, JSON on
stdout) or one clear line (exit 2, "gpuvet: ..." on stderr), within a time and memory bound;
never a traceback. The seed and the counts are fixed, so a run is the same run every time: a
failure names the input, and the mutated file is written under pytest's tmp_path to replay.
"""

from __future__ import annotations

import json
import re
import random
import resource
import time
from pathlib import Path

import pytest

from cli_runner import gpuvet

FIXTURES = Path(__file__).parent / "fixtures"
SEED = 18
CAPTURE_CASES = 90
RECORD_CASES = 40
SECONDS_PER_INPUT = 20.0  # generous: a loaded CI machine; the bounded readers answer in well under 1 s
MAX_RSS_MB = 2048

HOSTILE_TEXT = ["\x1b[2J\x1b]0;owned\x07", "N/A", "[N/A]", "nan", "inf", "-inf", "0x7fffffff", "1e30",
                "99999999999999999999", "-1", "\u202e", "\r", "\x00", "<!ENTITY x SYSTEM 'file:///etc/passwd'>",
                "GPU 20000000:", "GPU20000000", '"' + "A" * 140_000 + '"', "&x;", "]]>", "\ufeff", "#" * 40]
HOSTILE_VALUES = [None, [], {}, [1, 2], {"a": 1}, "x", "\x1b[31mred\x1b[0m", 10 ** 400, 1e308, -1, True,
                  "\ud800", "9" * 5000, json.loads("[" * 50 + "1" + "]" * 50)]


def capture_fixtures() -> list[Path]:
    folders = ("smi_xml", "smi_text", "smi_csv", "topo", "lspci", "proc_sysfs", "bundles")
    return sorted(p for folder in folders for p in (FIXTURES / folder).iterdir() if p.is_file())


def mutate_text(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True) or [""]
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        choice = rng.randrange(7)
        if choice == 0:
            lines = lines[: rng.randint(0, len(lines))]  # cut short
        elif choice == 1:
            lines.insert(i, lines[i] * rng.randint(2, 50))  # repeated
        elif choice == 2:
            del lines[i]
        elif choice == 3:
            lines[i] = _splice(lines[i], rng.choice(HOSTILE_TEXT), rng)
        elif choice == 4:  # a number replaced by a huge or odd one
            lines[i] = "".join(rng.choice(["99999999999", "nan", "-0", "1e999", c]) if c.isdigit() and rng.random() < 0.3
                               else c for c in lines[i])
        elif choice == 5:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        else:  # random bytes' worth of characters
            lines[i] = "".join(chr(rng.randrange(0x20, 0x2FF)) for _ in range(rng.randint(1, 80))) + "\n"
        lines = lines or [""]
    return "".join(lines)[:MUTATED_BYTES]


def _splice(line: str, piece: str, rng: random.Random) -> str:
    at = rng.randint(0, len(line))
    return line[:at] + piece + line[at:]


def mutate_record(data, rng: random.Random):
    for _ in range(rng.randint(1, 3)):
        paths = list(_paths(data))
        container, key = rng.choice(paths)
        choice = rng.randrange(4)
        if choice == 0:
            container[key] = rng.choice(HOSTILE_VALUES)
        elif choice == 1 and isinstance(container, dict):
            del container[key]
        elif choice == 2 and isinstance(container[key], str):
            container[key] = _splice(container[key], rng.choice(HOSTILE_TEXT), rng)
        else:
            container[key] = {"nested": container[key]} if rng.random() < 0.5 else [container[key]] * 3
    return data


def _paths(data, depth: int = 0):
    """(container, key) of every value, to depth 6."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        yield data, key
        if depth < 6:
            yield from _paths(value, depth + 1)


def assert_clean_outcome(code: int, out: str, err: str, what: str, expect_json: bool = True) -> None:
    assert "Traceback" not in out + err, what
    assert code in (0, 1, 2), (what, code, err[-300:])
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("gpuvet: "), (what, err[-300:])
        assert all(line.startswith("gpuvet: ") for line in lines), (what, err[-300:])
    elif expect_json:
        json.loads(out)  # a whole record


def timed(capsys, what: str, *argv: str) -> tuple[int, str, str]:
    start = time.monotonic()
    result = gpuvet(capsys, *argv)
    assert time.monotonic() - start < SECONDS_PER_INPUT, what
    return result


def test_mutated_captures_end_in_a_record_or_one_line(capsys, tmp_path):
    rng = random.Random(SEED)
    fixtures = capture_fixtures()
    codes = []
    for n in range(CAPTURE_CASES):
        source = rng.choice(fixtures)
        text = mutate_text(source.read_text(encoding="utf-8", errors="replace"), rng)
        path = tmp_path / f"case{n}-{source.stem}-edited-fuzz{source.suffix}"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        what = f"case {n}: {source.name} -> {path}"
        result = timed(capsys, what, "inspect", str(path), "--json")
        assert_clean_outcome(*result, what)
        codes.append(result[0])
    assert codes.count(2) >= 10 and len(codes) - codes.count(2) >= 10, codes  # both ends are exercised
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 < MAX_RSS_MB


def test_mutated_records_end_in_a_report_or_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUVET_DB", str(tmp_path / "runs.sqlite3"))
    rng = random.Random(SEED)
    records = sorted((FIXTURES / "records").glob("*.json"))
    shown = 0
    for n in range(RECORD_CASES):
        source = rng.choice(records)
        data = mutate_record(json.loads(source.read_text()), rng)
        path = tmp_path / f"case{n}-{source.stem}-edited-fuzz.json"
        path.write_text(json.dumps(data), encoding="utf-8", errors="surrogatepass")
        what = f"case {n}: {source.name} -> {path}"
        assert_clean_outcome(*timed(capsys, what, "report", str(path), "--format", "json"), what)
        code, out, err = timed(capsys, what, "import", str(path))
        assert_clean_outcome(code, out, err, what, expect_json=False)
        if code == 0 and out.startswith("imported"):
            run_id, shown = out.split()[-1], shown + 1
            # What `import` stores, `show` renders (terminal and Markdown) and `history` lists.
            assert_clean_outcome(*timed(capsys, what, "show", run_id, "--format", "json"), what)
            assert_clean_outcome(*timed(capsys, what, "show", run_id, "--format", "md"), what, expect_json=False)
            assert_clean_outcome(*timed(capsys, what, "history"), what, expect_json=False)
    assert shown >= 5  # some mutated records are stored and shown, not all refused
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 < MAX_RSS_MB


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"schema": "gpuvet.run/1", "x": "\\ud800"}',
                                  '["gpuvet.cluster/1"]', '{"schema": "gpuvet.run/1", "duration_s": 1e999}'])
def test_hostile_json_shapes_are_one_line_or_a_report(capsys, tmp_path, text):
    path = tmp_path / "hostile-edited.json"
    path.write_text(text)
    assert_clean_outcome(*timed(capsys, text[:30], "report", str(path), "--format", "json"), text[:30])


# -- two thousand mutated inputs within a minute ------------------------------------------------
# The end-to-end cases above take ~35 ms each (judging and rendering): 2,000 of them would not fit
# a minute on a 2-core CI machine. So every input goes through the reader `inspect` and `report`
# use (capture.read_captures for captures, record.load for records and watch logs: where the
# fuzzer's tracebacks and super-linear times were), and every 10th also through the whole command.
BULK_SEED = 30
BULK_CASES = 2000
END_TO_END_EVERY = 20
SEED_BYTES = 60_000  # the 8-GPU -q reports and the bundles (70-180 KB) are the end-to-end cases' seeds
MUTATED_BYTES = 400_000
SECONDS_PER_BULK_INPUT = 10.0
MAX_LINE = 2000
BULK_PIECES = HOSTILE_TEXT + ["\u2028", "\u2029", "\x9b31m", "\u202e\u2066", "1" * 5000, "0x" + "f" * 600, "9" * 600,
                              " " * 3000, "\t" * 500, "NaN", "1e999", "-0"]


def bulk_seeds() -> list[Path]:
    records = sorted((FIXTURES / "records").glob("*.json")) + sorted((FIXTURES / "records").glob("*.jsonl"))
    every = capture_fixtures() + sorted((FIXTURES / "kernel_log").iterdir()) + records
    return [p for p in every if p.stat().st_size <= SEED_BYTES]


def bulk_mutate(text: str, rng: random.Random) -> str:
    """Line-level damage like the shared fuzzer's (cut, repeated, swapped, spliced hostile pieces,
    numbers of thousands of digits, long runs of one character, other line ends), kept small."""
    lines = text.splitlines(keepends=True) or [""]
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        how = rng.randrange(9)
        if how == 0:
            lines = lines[: rng.randint(1, len(lines))]  # cut short, also inside a header
            lines[-1] = lines[-1][: rng.randint(0, len(lines[-1]))]
        elif how == 1:
            lines.insert(i, lines[i] * rng.choice([2, 20, 100]))
        elif how == 2:
            del lines[i: i + rng.choice([1, 3, 10])]
        elif how == 3:
            lines[i] = _splice(lines[i], rng.choice(BULK_PIECES), rng)
        elif how == 4:
            lines[i] = re.sub(r"\d+", lambda m: rng.choice(["1" * 5000, "99999999999999999999999", "nan", "-1", m.group()]), lines[i])
        elif how == 5:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif how == 6:
            lines[i] = _splice(lines[i], rng.choice(" A9|:<\u202e") * rng.choice([1000, 20_000, 50_000]), rng)
        elif how == 7:
            lines = [line.replace("\n", rng.choice(["\r\n", "\r", "\u2028"])) for line in lines]
        else:
            lines[i] = "".join(chr(rng.randrange(0x20, 0x2FF)) for _ in range(rng.randint(1, 80))) + "\n"
        lines = lines or [""]
    return "".join(lines)[:MUTATED_BYTES]


def _read(path: Path) -> None:
    """What `inspect` and `report` do first with a file: ValueError (CaptureError, RecordError: one
    line and exit 2 at the command line) is an answer; anything else is a traceback."""
    from gpuvet.probe.capture import read_captures
    from gpuvet.record.load import WATCH, load
    from gpuvet.watch import parse_log

    head = path.read_bytes()[:200].lstrip()
    if head.startswith((b"{", b"[")):
        loaded = load(str(path))
        if loaded.kind == WATCH:
            parse_log(loaded.data.encode("utf-8", "surrogatepass"))
        elif loaded.kind != "cluster":
            loaded.runs()
    else:
        read_captures(str(path))


def test_two_thousand_mutated_inputs_within_a_minute(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUVET_DB", str(tmp_path / "runs.sqlite3"))
    rng = random.Random(BULK_SEED)
    seeds = [(p, p.read_text(encoding="utf-8", errors="replace")) for p in bulk_seeds()]
    start = time.monotonic()
    end_to_end = 0
    for n in range(BULK_CASES):
        source, text = rng.choice(seeds)
        path = tmp_path / f"bulk{n}-{source.stem}-edited-fuzz{source.suffix}"
        path.write_text(bulk_mutate(text, rng), encoding="utf-8", errors="surrogatepass")
        what = f"bulk case {n}: {source.name} -> {path}"
        began = time.monotonic()
        try:
            _read(path)
        except ValueError:
            pass
        assert time.monotonic() - began < SECONDS_PER_BULK_INPUT, what
        if n % END_TO_END_EVERY == 0:
            end_to_end += 1
            argv = ["report", str(path), "--format", "md"] if source.suffix in (".json", ".jsonl") else ["inspect", str(path)]
            code, out, err = timed(capsys, what, *argv)
            assert_clean_outcome(code, out, err, what, expect_json=False)
            longest = max((len(line) for line in (out + err).splitlines()), default=0)
            assert longest <= MAX_LINE, (what, longest)
        path.unlink()
    print(f"{BULK_CASES} mutated inputs in {time.monotonic() - start:.1f} s, {end_to_end} of them end to end")
    assert end_to_end == -(-BULK_CASES // END_TO_END_EVERY)
