"""The catalogue (gpuvet.catalog) is the one list of check ids and benchmarks: every id the product
emits or the docs, doctor, the checklist and the tests name is in it, and `gpuvet checks` lists it."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from gpuvet import actions, catalog, doctor, judge
from gpuvet.report import catalog_view, checklist

from cli_runner import gpuvet

ROOT = Path(__file__).resolve().parent.parent
AREAS = "|".join(sorted({c.area for c in catalog.CHECKS}))
# Where a string is used as a check id: a finding built with it, a finding's check compared or
# keyed by it, a record's "check" field.
ID_USES = [re.compile(p) for p in (
    rf"finding\(\s*\"((?:{AREAS})\.[a-z0-9_]+)\"",
    rf"check\s*[!=]=\s*\"((?:{AREAS})\.[a-z0-9_]+)\"",
    rf"\"check\":\s*\"((?:{AREAS})\.[a-z0-9_]+)\"",
    rf"check=\"((?:{AREAS})\.[a-z0-9_]+)\"",
)]


def _ids_used_in(paths: list[Path]) -> dict[str, str]:
    used = {}
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        for pattern in ID_USES:
            for match in pattern.finditer(text):
                used.setdefault(match.group(1), str(path.relative_to(ROOT)))
    return used


def test_ids_are_unique_and_named_by_their_area():
    ids = [c.id for c in catalog.CHECKS]
    assert len(ids) == len(set(ids))
    assert all(c.id.split(".")[0] == c.area for c in catalog.CHECKS)
    assert all(c.looks_at and c.fails_when and c.doc for c in catalog.CHECKS)


def test_every_rule_and_benchmark_named_exists():
    for check in catalog.CHECKS:
        module, function = check.rule.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(f"gpuvet.judge.{module}"), function)), check.id
        assert check.benchmark is None or check.benchmark in catalog.BENCHMARK_BY_NAME, check.id
    for bench in catalog.BENCHMARKS:
        assert importlib.util.find_spec(f"gpuvet.{bench.module}") is not None, bench.name
        assert bench.cpu_capable == (bench.where == "host" or bench.cpu_budget_s is not None), bench.name


def test_the_judge_runs_every_rule_of_the_catalogue_and_no_other():
    def names(rules):
        return {f"{rule.__module__.removeprefix('gpuvet.judge.')}.{rule.__name__}" for rule in rules.values()}

    assert names(judge.RULES) == {c.rule for c in catalog.CHECKS if c.emitted_by in ("run", "net test")}
    assert names(judge.HEALTH_RULES) - names(judge.RULES) == {c.rule for c in catalog.CHECKS if c.emitted_by == "health"}


def test_every_id_used_in_the_code_and_the_tests_is_in_the_catalogue():
    files = sorted((ROOT / "src" / "gpuvet").rglob("*.py")) + sorted((ROOT / "tests").glob("*.py"))
    files += sorted(p for p in (ROOT / "tests" / "fixtures").rglob("*.json"))
    used = _ids_used_in(files)
    assert len(used) > 40  # the scan sees the ids (a broken pattern would pass everything)
    unknown = {i: where for i, where in used.items() if not catalog.is_check(i)}
    assert not unknown


def test_doctor_and_the_checklist_cite_only_catalogued_ids():
    cited = {check for symptom in doctor.SYMPTOMS for cause in symptom.causes for check in cause.rules_out + cause.checks}
    cited |= {check for item in checklist.ITEMS for check in item.checks}
    families = {c for c in cited if c.endswith(".*")}
    assert not {c for c in cited - families if not catalog.is_check(c)}
    assert all(any(i.startswith(f[:-1]) for i in catalog.BY_ID) for f in families)


def test_the_readme_check_tables_are_the_catalogues():
    # Made from the catalogue, never written twice: refresh with the command the marker names.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert catalog_view.README_BEGIN in readme and catalog_view.README_END in readme
    assert catalog_view.with_readme_tables(readme, catalog.CHECKS) == readme, (
        "README's check tables differ from the catalogue: python -m gpuvet.report.catalog_view --readme README.md")
    for check in catalog.CHECKS:  # every check a row, with its levels and action
        assert f"| `{check.id}` |" in readme and f"| `{check.action}` |" in readme


def test_every_check_names_its_levels_and_an_action_remediators_know():
    assert {c.action for c in catalog.CHECKS} <= set(actions.NAMES)
    assert catalog.at_level(catalog.HEALTH) == tuple(judge.HEALTH_RULES)
    quick = set(catalog.at_level(catalog.QUICK))
    assert "gpu.ecc" in quick and "gpu.gemm" not in quick  # facts at every level, benchmarks at run and soak
    assert "gpu.gemm" in catalog.at_level(catalog.SOAK) and "gpu.isolation" not in catalog.at_level(catalog.HEALTH)


def test_benchmark_lists_are_the_catalogue():
    from gpuvet import runner
    from gpuvet.bench import host_plan, plan, schedule, worker

    assert tuple(runner.ALL_BENCHMARKS) == catalog.ALL_BENCHMARKS
    assert plan.ALL == worker.MODULES == schedule.GPU_BENCHMARKS == catalog.GPU_BENCHMARKS
    assert tuple(host_plan.HOST) == catalog.HOST_BENCHMARKS
    gemm = catalog.BENCHMARK_BY_NAME["gemm"]
    assert (schedule.BENCH_BUDGET_S["gemm"], schedule.CPU_BUDGET_S["gemm"]) == (gemm.budget_s, gemm.cpu_budget_s)
    assert set(plan.FRESH_PROCESS) == {"latency", "allreduce"}
    assert set(schedule.CPU_CAPABLE) == {"gemm", "membw", "sustained", "allreduce", "workload"}
    assert judge.BENCH_CHECKS["workload"] == ("workload.throughput", "workload.checkpoint", "workload.resume")
    assert judge.BENCH_CHECKS["net"] == ("net.loopback",)  # net.node_to_node is `gpuvet net test`'s


def test_gpuvet_checks_lists_every_id_and_benchmark(capsys):
    code, out, _ = gpuvet(capsys, "checks", "--json")
    assert code == 0
    listed = json.loads(out)
    assert [c["id"] for c in listed["checks"]] == [c.id for c in catalog.CHECKS]
    assert {b["name"] for b in listed["benchmarks"]} == set(catalog.ALL_BENCHMARKS)
    code, out, _ = gpuvet(capsys, "checks")
    assert code == 0
    assert all(c.id in out for c in catalog.CHECKS)


@pytest.mark.parametrize("check_id", ["gpu.pcie_link", "storage.small_files", "net.node_to_node", "watch.lost",
                                      "cluster.ring", "cpu.gemm", "env.jupyter"])
def test_families_are_expanded(check_id):
    assert catalog.is_check(check_id)


def _gpuvet_module_names(tree) -> set[str]:
    """Names a module binds to other gpuvet modules (`from . import nvml`, `from ..bench import net as net_bench`)."""
    import ast

    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("gpuvet")):
            bound |= {alias.asname or alias.name for alias in node.names}
    return bound


def test_no_private_name_is_imported_across_modules():
    import ast

    crossings = []
    for path in sorted((ROOT / "src" / "gpuvet").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = _gpuvet_module_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                crossings += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                  and node.attr.startswith("_") and not node.attr.startswith("__")):
                crossings.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not crossings
