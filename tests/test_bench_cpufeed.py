"""The CPU feed-rate benchmark runs for real here (2 cores, spawned workers), and every way a
worker can go wrong (crash, hang, exception, Ctrl-C) ends as a note with no process left behind."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpuvet.bench import cpufeed


def worker_processes() -> list[psutil.Process]:
    """Our spawned multiprocessing workers (the long-lived resource tracker is not one)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(autouse=True)
def no_workers_left_behind():
    assert worker_processes() == []
    yield
    assert worker_processes() == [], "a cpufeed worker outlived run()"


# -- broken workers (module level: spawned processes import them by name) ----------------------

def crashing_worker(conn, job):
    os._exit(3)


def hanging_worker(conn, job):
    conn.send(("ready", {"tensor": "none"}))
    threading.Event().wait()  # never returns: the parent must kill it


def silent_worker(conn, job):
    threading.Event().wait()  # never even reports ready


def corrupt_jpeg_worker(conn, job):
    cpufeed.feed_worker(conn, dataclasses.replace(job, jpegs=(b"this is not a JPEG",)))


# -- the real benchmark -------------------------------------------------------------------------

def run_in_fresh_process(code: str) -> dict:
    """Run gpuvet code in a new interpreter (as the CLI would) and return what it prints as JSON."""
    src = str(Path(__file__).parent.parent / "src")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": src})
    return json.loads(done.stdout.splitlines()[-1])


def test_measures_a_positive_feed_rate_with_two_workers_and_no_torch_in_the_parent():
    out = run_in_fresh_process(
        "import json, sys; from gpuvet.bench import cpufeed; (m,) = cpufeed.run(budget_s=2.0, workers=2); "
        "print(json.dumps({'m': m, 'parent_imported_torch': 'torch' in sys.modules}))")
    m = out["m"]
    assert out["parent_imported_torch"] is False  # workers import torch, as DataLoader workers have it; gpuvet stays light
    assert m["name"] == "cpu.feed_rate" and m["subject"] == "cpu" and m["unit"] == "samples/s", m
    d = m["details"]
    assert m["value"] > 0
    assert d["workers"] == 2 and len(d["per_worker"]) == 2 and all(rate > 0 for rate in d["per_worker"])
    assert math.isclose(sum(d["per_worker"]), m["value"], rel_tol=0.01)
    assert d["samples"] >= 2
    # The budget covers starting the workers: the window is what start-up left of it (or the minimum).
    left = max(0.0, d["budget_s"] - d["start_s"])
    assert d["budget_s"] == 2.0 and d["measure_s"] == pytest.approx(max(cpufeed.MIN_MEASURE_S, 0.85 * left), abs=0.01)
    assert 0 < d["cpu_share"] <= 1.05
    assert d["uncontended_rate"] >= m["value"] * 0.95  # a core each can only help
    assert set(d["ms_per_sample"]) == set(cpufeed.STEPS)
    assert d["image"]["width"] == 500 and d["image"]["height"] == 375
    assert 50_000 < d["image"]["jpeg_bytes_mean"] < 200_000  # ImageNet's average is ~110 KB
    assert "synthetic" in d["image"]["content"]
    assert d["libraries"]["Pillow"]
    assert d["libraries"]["tensor"].startswith("torch ")  # torch is in the test venv: used like a DataLoader


def test_a_server_warmed_up_in_the_background_serves_the_run_and_torch_stays_out_of_gpuvet():
    out = run_in_fresh_process(
        "import json, sys; from gpuvet.bench import cpufeed; cpufeed.warm_up(); (m,) = cpufeed.run(budget_s=2.0, workers=2); "
        "print(json.dumps({'m': m, 'parent_imported_torch': 'torch' in sys.modules}))")
    assert out["parent_imported_torch"] is False
    assert out["m"]["value"] > 0 and out["m"]["details"]["workers"] == 2
    assert out["m"]["details"]["libraries"]["tensor"].startswith("torch ")  # the server's preload reached the workers


def test_runs_without_torch_on_pil_float_bands():
    (m,) = cpufeed.run(budget_s=1.0, workers=1, use_torch=False)
    assert m["name"] == "cpu.feed_rate" and m["value"] > 0
    assert m["details"]["libraries"]["tensor"] == "PIL float bands (no torch)"


def test_default_worker_count_is_at_most_the_cores_this_process_may_use():
    assert 1 <= cpufeed.usable_core_count() <= len(os.sched_getaffinity(0))


# -- failures become notes, in time, with nothing left running --------------------------------

def test_a_crashing_worker_becomes_a_failure_note():
    t0 = time.monotonic()
    (note,) = cpufeed.run(budget_s=1.0, workers=2, worker=crashing_worker)
    assert time.monotonic() - t0 < 20
    assert note["name"] == "bench.cpu" and note["value"] is None and note["subject"] == "cpu"
    assert note["details"]["outcome"] == "failed"
    assert "died" in note["details"]["reason"] and "exit code 3" in note["details"]["reason"]


def test_a_worker_hanging_while_measuring_is_killed_at_the_deadline():
    t0 = time.monotonic()
    (note,) = cpufeed.run(budget_s=0.5, workers=1, worker=hanging_worker)
    elapsed = time.monotonic() - t0
    assert note["details"]["outcome"] == "failed"
    assert "no answer" in note["details"]["reason"] and "measuring" in note["details"]["reason"]
    # budget + grace + stopping, plus the worker's start-up: far from "forever"
    assert elapsed < 0.5 + cpufeed.RESULT_GRACE_S + cpufeed.STOP_WAIT_S + 15


def test_a_worker_that_never_starts_is_killed_at_the_start_timeout():
    t0 = time.monotonic()
    (note,) = cpufeed.run(budget_s=0.5, workers=2, worker=silent_worker, start_timeout_s=1.0)
    assert time.monotonic() - t0 < 1.0 + cpufeed.STOP_WAIT_S + 10
    assert "starting" in note["details"]["reason"] and "2 of 2 workers" in note["details"]["reason"]


def test_an_exception_in_a_worker_is_reported_with_its_message():
    (note,) = cpufeed.run(budget_s=0.5, workers=1, worker=corrupt_jpeg_worker, use_torch=False)
    assert note["details"]["outcome"] == "failed"
    assert "worker 0 failed" in note["details"]["reason"] and "UnidentifiedImageError" in note["details"]["reason"]


def test_ctrl_c_stops_every_worker_and_propagates():
    def interrupt_while_measuring(message: str) -> None:
        if "decoding" in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cpufeed.run(budget_s=5.0, workers=2, progress=interrupt_while_measuring, use_torch=False)
    # the autouse fixture checks that no worker is left


def test_without_pillow_the_benchmark_is_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # makes `import PIL` raise ImportError
    (note,) = cpufeed.run(budget_s=1.0, workers=1)
    assert note["details"] == {"outcome": "skipped", "reason": "Pillow is not installed: `pip install Pillow`"}


# -- the transform itself --------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(50))
def test_random_resized_crop_box_stays_in_the_image_with_torchvision_limits(seed):
    rng = random.Random(seed)
    left, top, right, bottom = cpufeed.random_resized_crop_box(500, 375, rng)
    assert 0 <= left < right <= 500 and 0 <= top < bottom <= 375
    w, h = right - left, bottom - top
    assert 0.075 <= w * h / (500 * 375) <= 1.0  # 8%..100% of the area, give or take rounding
    assert 3 / 4 - 0.02 <= w / h <= 4 / 3 + 0.02


def test_random_resized_crop_falls_back_to_a_centre_crop_for_extreme_shapes():
    # A 1000x10 strip: no 8%+ crop with aspect <= 4/3 fits, so ten tries fail.
    assert cpufeed.random_resized_crop_box(1000, 10, random.Random(0)) == (493, 0, 506, 10)


def test_generated_jpegs_decode_to_the_expected_size():
    from PIL import Image

    jpegs = cpufeed.make_jpegs(count=2)
    assert len({len(j) for j in jpegs}) == 2  # different content
    for jpeg in jpegs:
        img = Image.open(io.BytesIO(jpeg))
        assert img.format == "JPEG" and img.size == (500, 375) and img.mode == "RGB"


def test_pipeline_output_is_a_normalized_chw_tensor():
    torch = pytest.importorskip("torch")
    pipeline = cpufeed.Pipeline(use_torch=True, seed=0)
    tensor = pipeline.sample(cpufeed.make_jpegs(count=1)[0])
    assert tuple(tensor.shape) == (3, 224, 224) and tensor.dtype == torch.float32
    # (x/255 - mean)/std stays within [(0 - 0.485)/0.229, (1 - 0.406)/0.225] ~ [-2.12, 2.64]
    assert -2.2 < float(tensor.min()) and float(tensor.max()) < 2.7
    assert all(pipeline.step_s[step] > 0 for step in ("decode", "crop_resize", "to_tensor_normalize"))
