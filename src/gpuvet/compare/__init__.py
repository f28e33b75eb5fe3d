"""Runs side by side, and what a result costs on each (D2); one machine over time (D1).

Pure: run records in, a `Comparison` or a `Trend` out; no I/O. The seed's point (5.2) is that a
machine cheap per hour is often dear per result, so next to the measurements this package prices
the work itself:

* USD per PFLOP-hour achieved = price_per_hour / (sum of the GPUs' TFLOPS / 1000), i.e. the
  price of one hour divided by the PFLOP-hours the machine delivers in that hour; a GPU that was
  not measured counts as the median of those that were. A synchronous data-parallel job waits
  for its slowest GPU, so where the GPUs differ a second row prices the machine at the slowest
  GPU's rate x GPUs;
* USD per million training tokens = price_per_hour / (machine tokens/s x 3600 / 1e6), from the
  reference workload's `workload.tokens_per_s`, only between runs of the same workload shape
  (model, batch, dtype): tokens of a 2-layer model say nothing about a 12-layer one;
* a job the user describes ("8 h on RUN") is scaled to every other run by the ratio of machine
  throughput (workload tokens/s of the same shape, else sustained TFLOPS, else bf16 GEMM TFLOPS),
  and costs hours x price.

Split as doctor/ is: `shapes` (the types), `data` (a run's figures and which quantities count),
`names` (runs named as a user writes them, jobs and prices), `rows` (quantities and checks across
the runs), `cost` (prices per result, the job, the ranking), `sentences` (what is said),
`side_by_side` (`compare`, putting them together) and `trend` (one machine over time). Rendering
is in report/compare_view.py.
"""

from __future__ import annotations

from .data import (COST_BASES, GEMM_BF16, JOB_METRICS, KEY_FIGURES, STEAL, SUSTAINED, TOKENS, TREND_FIGURES, gpu_summary,
                   key_figures, lower_is_better, machine_rate, machine_rates, run_figures, trend_values, workload_shape)
from .names import entry, find_run, parse_job, with_prices
from .shapes import (Comparison, Figure, FindingRow, JobEstimate, MachineRate, Ranked, Row, RunColumn, Trend,
                     TrendFigure)
from .side_by_side import compare
from .trend import history_trend

__all__ = ["COST_BASES", "GEMM_BF16", "JOB_METRICS", "KEY_FIGURES", "STEAL", "SUSTAINED", "TOKENS", "TREND_FIGURES",
           "Comparison", "Figure", "FindingRow", "JobEstimate", "MachineRate", "Ranked", "Row", "RunColumn", "Trend",
           "TrendFigure", "compare", "entry", "find_run", "gpu_summary", "history_trend", "key_figures",
           "lower_is_better", "machine_rate", "machine_rates", "parse_job", "run_figures", "trend_values",
           "with_prices", "workload_shape"]
