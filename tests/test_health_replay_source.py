"""`gpuvet health` under GPUVET_NVML_REPLAY judges a capture's GPUs: its record says replay, not live
(as `gpuvet run`'s does), so a node's history never holds a test capture as its own health."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_health_run_under_replay_is_recorded_as_the_replay(tmp_path):
    riser = FIXTURES / "smi_xml" / "gtx-1070-x6-riser-pcie-x1-384.66-v9.xml"
    out = tmp_path / "health.json"
    subprocess.run([sys.executable, "-m", "gpuvet", "health", "--no-save", "--out", str(out)], check=False,
                   capture_output=True, text=True, timeout=60, env={**os.environ, "GPUVET_NVML_REPLAY": str(riser)})
    machine = json.loads(out.read_text())["machine"]
    assert machine["source"] == f"replay: {riser}"
    assert {"path": str(riser), "kind": "nvml-replay"} in machine["captures"]
