"""`gpuvet checks`: the catalogue of checks and benchmarks as plain lines."""

from __future__ import annotations

from collections.abc import Iterable

from ..catalog import Benchmark, Check


def catalog_lines(checks: Iterable[Check], benchmarks: Iterable[Benchmark]) -> list[str]:
    checks, benchmarks = list(checks), list(benchmarks)
    width = max(len(c.id) for c in checks)
    lines = ["Checks (PASS, WARN, FAIL or SKIP each; ids are stable):"]
    for emitted_by in dict.fromkeys(c.emitted_by for c in checks):
        lines.append(f"  from {'gpuvet ' if emitted_by != 'watch log' else 'a '}{emitted_by}:")
        for c in (c for c in checks if c.emitted_by == emitted_by):
            fed = f" [bench {c.benchmark}]" if c.benchmark else ""
            lines.append(f"    {c.id:<{width}}  {c.looks_at}. Fails: {c.fails_when}{fed}")
    lines.append("Benchmarks (`gpuvet bench NAME`; budgets are `gpuvet bench`'s):")
    name_width = max(len(b.name) for b in benchmarks)
    for b in benchmarks:
        traits = [b.where] + (["cpu-capable"] if b.cpu_capable else []) + (["fresh processes"] if b.fresh_process else [])
        lines.append(f"    {b.name:<{name_width}}  {b.doc} ({', '.join(traits)}; {b.budget_s:g} s; gpuvet.{b.module})")
    return lines
