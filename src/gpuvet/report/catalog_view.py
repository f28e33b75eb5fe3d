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
            levels = f" [{', '.join(c.levels)}]" if c.levels else ""
            lines.append(f"    {c.id:<{width}}  {c.looks_at}. Fails: {c.fails_when}{fed}{levels} [action {c.action}]")
    lines.append("Benchmarks (`gpuvet bench NAME`; budgets are `gpuvet bench`'s):")
    name_width = max(len(b.name) for b in benchmarks)
    for b in benchmarks:
        traits = [b.where] + (["cpu-capable"] if b.cpu_capable else []) + (["fresh processes"] if b.fresh_process else [])
        lines.append(f"    {b.name:<{name_width}}  {b.doc} ({', '.join(traits)}; {b.budget_s:g} s; gpuvet.{b.module})")
    return lines


# The README's check tables are made from the catalogue here; a test holds the README to them. To
# refresh them after changing the catalogue: python -m gpuvet.report.catalog_view --readme README.md
README_BEGIN = "<!-- check tables: made from src/gpuvet/catalog.py by `python -m gpuvet.report.catalog_view --readme README.md` -->"
README_END = "<!-- end of the check tables -->"
_GROUPS = (
    ("Facts (`gpuvet run --quick`, `gpuvet inspect`; those marked health also in `gpuvet health`):",
     lambda c: c.emitted_by == "run" and not c.benchmark),
    ("Benchmarks (`gpuvet run`, `gpuvet bench`):", lambda c: c.emitted_by == "run" and bool(c.benchmark)),
    ("Other commands: `gpuvet health`, `gpuvet net test`, a multi-node run (`gpuvet cluster`) and a watch "
     "log (`gpuvet report LOG`):", lambda c: c.emitted_by != "run"),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def readme_tables(checks: Iterable[Check]) -> str:
    """The README's check tables: one row per check, its levels and its default action."""
    checks = list(checks)
    out = [README_BEGIN]
    for title, belongs in _GROUPS:
        out += ["", title, "", "| check | what it looks at | fails when | levels | action |", "|---|---|---|---|---|"]
        for c in (c for c in checks if belongs(c)):
            fed = f" (bench `{c.benchmark}`)" if c.benchmark else ""
            where = ", ".join(c.levels) or ("a watch log" if c.emitted_by == "watch log" else f"`gpuvet {c.emitted_by}`")
            out.append(f"| `{c.id}` | {_cell(c.looks_at)}{fed} | {_cell(c.fails_when)} | {where} | `{c.action}` |")
    return "\n".join(out + ["", README_END])


def with_readme_tables(readme: str, checks: Iterable[Check]) -> str:
    """The README with its check tables replaced by the catalogue's."""
    head, _, rest = readme.partition(README_BEGIN)
    _, _, tail = rest.partition(README_END)
    return head + readme_tables(checks) + tail


if __name__ == "__main__":  # python -m gpuvet.report.catalog_view --readme README.md
    import sys
    from pathlib import Path

    from ..catalog import CHECKS

    path = Path(sys.argv[2])
    path.write_text(with_readme_tables(path.read_text(encoding="utf-8"), CHECKS), encoding="utf-8")
