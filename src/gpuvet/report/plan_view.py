"""`gpuvet run --plan` / `gpuvet inspect CAPTURE --plan`: the steps a run would take, rendered from
the plan's dict (bench/schedule.py makes it; this module only lays it out)."""

from __future__ import annotations

from typing import Any


def render_plan(plan: dict[str, Any]) -> str:
    lines = [f"gpuvet plan · {plan['profile']} run · "
             + (f"{len(plan['gpus'])} GPU(s) loaded" if plan["device"] != "cpu" else "on the CPU")]
    width = max((len(s["name"]) for s in plan["steps"]), default=6)
    where = max((len(s["where"]) for s in plan["steps"]), default=4)
    elapsed = 0.0
    steps = plan["steps"]
    for i, step in enumerate(steps):
        if step["skipped"]:
            if i and steps[i - 1]["skipped"] == step["skipped"]:
                continue  # one line for a run of steps skipped for the same reason
            same = [step["name"]]
            for later in steps[i + 1:]:
                if later["skipped"] != step["skipped"]:
                    break
                same.append(later["name"])
            lines.append(f"  {'':>7}  {', '.join(same)} skipped: {step['skipped']}")
            continue
        lines.append(f"  {_clock(elapsed):>7}  {step['name']:<{width}}  {step['where']:<{where}}  "
                     f"{step['budget_s']:>5.1f} s  {step['how']}")
        elapsed += step["budget_s"]
    total = f"planned total {plan['total_s']:.0f} s"
    if plan.get("target_s"):
        total += f" (the default run's target: at most {plan['target_s']:.0f} s on 8 GPUs)"
    lines.append("  " + total + "; each step's budget is its upper bound: the run stops it there")
    lines += [f"  note: {note}" for note in plan["notes"]]
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    """The step's start, as t+M:SS from the run's start."""
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"t+{minutes}:{rest:02d}"
