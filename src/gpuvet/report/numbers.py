"""How a figure is written in every report: thousands grouped, small values to four significant
digits (52,482 IOPS, not 5.248e+04; 0.1611 TFLOPS)."""

from __future__ import annotations


def number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
