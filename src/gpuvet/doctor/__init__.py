"""gpuvet doctor: from a symptom to its likely causes, and the checks that tell them apart.

Covers every row of the first seed's troubleshooting table (5.1) and the cases of the second
seed (model.to('cuda') hanging, "no kernel image is available", NCCL hangs, memory figures that
disagree), the symptoms both documents describe in passing (a GPU 100% busy yet slower, Xid and
ECC errors, SSH sessions dropping, a slow Jupyter), found from the readers' own words in Chinese or
English (vocabulary.py). Given a run record, each cause is answered from it: confirmed (a check failed or
warned, or a fact shows it), ruled out (a check that tests the cause passed: a measurement under
load, or a reading of the very setting at fault), or unknown (not tested: here is the command that
tests it). A passing check that only bears on a cause (an idle snapshot for a slowdown that comes
under load, the core count for a CPU feed rate) is shown, but rules nothing out. Without a record,
doctor says what to run.
"""

from __future__ import annotations

from .diagnose import diagnose, find_symptom, known_symptoms
from .shapes import CONFIRMED, RULED_OUT, UNKNOWN, Cause, CauseResult, Diagnosis, Symptom
from .symptoms import SYMPTOMS
from .view import render_doctor

__all__ = ["CONFIRMED", "RULED_OUT", "UNKNOWN", "Cause", "CauseResult", "Diagnosis", "SYMPTOMS", "Symptom",
           "diagnose", "find_symptom", "known_symptoms", "render_doctor"]
