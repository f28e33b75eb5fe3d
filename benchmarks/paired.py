"""What the engine-against-peer scripts share: rounds alternate which engine goes first."""

from __future__ import annotations

import statistics


def by_order(values: list[float], firsts: list[str]) -> str:
    """Median of the rounds each engine ran first in: a large gap means an order effect."""
    parts = []
    for engine in dict.fromkeys(firsts):
        mine = [v for v, first in zip(values, firsts) if first == engine]
        parts.append(f"{engine} first {statistics.median(mine):.2f}")
    return ", ".join(parts)
