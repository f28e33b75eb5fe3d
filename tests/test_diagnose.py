"""The watch's diagnosis rules (judge/diagnose.py) on telemetry series.

Recorded series are built from real captures with gpuvet's own parsers: `nvidia-smi dmon` rows (one a
second) give power, temperature, utilization and clocks; the `nvidia-smi -q` taken in the same
session gives the GPU's facts (max clocks, limits, processes, memory used, clock-event reasons).
Where no capture shows a condition (a lowered power limit, a starving input pipeline, a heat soak),
the series is SYNTHETIC and its name says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvet.facts import CLOCK_EVENT_REASONS, Gpu
from gpuvet.judge import diagnose
from gpuvet.judge.diagnose import Diagnosis, GpuProcessSeen, HostSample, diagnose_gpu, diagnose_job
from gpuvet.probe import capture, smi_table
from gpuvet.telemetry import Sample

FIXTURES = Path(__file__).parent / "fixtures"
H100_BUNDLE = FIXTURES / "bundles" / "h100-80gb-hbm3-vm-590.48.01.txt"
T0 = 1_790_000_000.0


# -- recorded series from real captures ------------------------------------------------------------

def _bundle_section(path: Path, title: str) -> str:
    """The body of one section of a capture bundle (between its banner and the next one)."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# {title}"))
    body_start = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("#####")) + 1
    end = next((i for i in range(body_start, len(lines)) if lines[i].startswith("#####")), len(lines))
    return "\n".join(lines[body_start:end])


def _facts(path: Path, index: int = 0) -> Gpu:
    (cap,) = capture.read_captures(str(path))
    return next(g for g in cap.gpus if g.index == index)


def _mask(gpu: Gpu) -> int | None:
    if gpu.clocks.event_reasons is None:
        return None
    bits = {name: bit for bit, name in CLOCK_EVENT_REASONS.items()}
    return sum(bits[name] for name in gpu.clocks.event_reasons)


def _dmon_series(dmon_text: str, facts: Gpu) -> list[Sample]:
    """dmon rows (1 s apart) as telemetry samples; limit, memory used and reasons from the same
    session's `nvidia-smi -q` (dmon does not print them)."""
    rows = smi_table.parse_dmon(dmon_text)
    return [Sample(t=T0 + i, power_w=float(r["pwr"]), power_limit_w=facts.power.enforced_limit_w,
                   sm_mhz=r["pclk"], mem_mhz=r["mclk"], temp_c=float(r["gtemp"]), util_pct=r["sm"],
                   mem_used_mib=facts.memory_used_mib, reasons=_mask(facts))
            for i, r in enumerate(rows)]


def _snapshot_series(facts: Gpu) -> list[Sample]:
    """A single real reading (an `nvidia-smi -q` snapshot) as a one-sample window."""
    return [Sample(t=T0, power_w=facts.power.draw_w, power_limit_w=facts.power.enforced_limit_w,
                   sm_mhz=facts.clocks.sm_mhz, mem_mhz=facts.clocks.memory_mhz, temp_c=facts.thermal.gpu_c,
                   util_pct=facts.utilization_pct, mem_used_mib=facts.memory_used_mib, reasons=_mask(facts))]


def _seen(facts: Gpu, visible: bool = True) -> list[GpuProcessSeen]:
    return [GpuProcessSeen(p.pid, p.used_memory_mib, visible, None, p.name) for p in facts.processes or []]


@pytest.fixture(scope="module")
def h100_load() -> tuple[list[Sample], Gpu]:
    """Recorded: H100 80GB HBM3 VM under gpu-burn + 2 memhogs (dmon -c 5 and -q of the same bundle)."""
    facts = _facts(FIXTURES / "smi_text" / "q-h100-80gb-hbm3-vm-590.48.01-load.txt")
    return _dmon_series(_bundle_section(H100_BUNDLE, "load :: dmon"), facts), facts


def test_recorded_h100_gpu_burn_is_ok_at_its_power_limit(h100_load):
    samples, facts = h100_load
    assert [s.power_w for s in samples] == [631, 634, 633, 634, 636]  # the capture, not made up
    d = diagnose_gpu(samples, facts, _seen(facts))
    assert d.state == "ok" and d.also == ()
    assert d.text.startswith("ok: 100% busy, SM 1980 MHz = 100% of max, 634 W = 91% of the limit")
    assert "at its power limit, normal under full load" in d.text
    assert d.evidence["samples"] == 5 and d.evidence["span_s"] == 4.0


def test_recorded_h100_seen_from_another_container_is_a_neighbour(h100_load):
    # The same recorded load, but none of its three processes exists in this process table: what a
    # tenant sees when someone else's job runs on "their" GPU.
    samples, facts = h100_load
    d = diagnose_gpu(samples, facts, _seen(facts, visible=False))
    assert d.state == "neighbour"
    assert d.text == "neighbour: 100% utilization and 19.4 GiB in use by processes you cannot see"
    assert d.evidence["unseen_mib"] == 19818 and d.evidence["your_processes"] == 0


def test_recorded_h100_in_a_container_without_the_host_pids_is_not_called_a_neighbour(h100_load):
    # NVML gives host pids; a container with its own PID namespace cannot map them, so the processes
    # may be the user's own job: diagnosed on its numbers, with the reason the processes are unseen.
    samples, facts = h100_load
    for following in (False, True):
        d = diagnose_gpu(samples, facts, _seen(facts, visible=False), in_container=True, following_job=following)
        assert d.state == "ok" and "neighbour" not in d.also
        assert d.text.endswith("; processes NVML lists are not visible in this container (PID namespace): they may be yours")
        assert "--pid" not in d.text and d.evidence["unmapped_processes"] == 3


def test_recorded_h100_in_a_container_with_one_process_seen_keeps_the_neighbour_rule(h100_load):
    # One of the three processes is this container's own: the other two are somebody else's.
    samples, facts = h100_load
    procs = [GpuProcessSeen(p.pid, p.used_memory_mib, p.pid == 11345, None, p.name) for p in facts.processes]
    d = diagnose_gpu(samples, facts, procs, in_container=True)
    assert d.state == "neighbour" and "not visible in this container" not in d.text


def test_recorded_h100_with_one_process_outside_the_followed_job(h100_load):
    samples, facts = h100_load
    procs = [GpuProcessSeen(p.pid, p.used_memory_mib, True, p.pid == 11345, p.name) for p in facts.processes]
    d = diagnose_gpu(samples, facts, procs, following_job=True)
    assert d.state == "neighbour"
    assert "4.0 GiB held by 2 process(es) outside your job (11327 /root/tools/memhog, 11328 /root/tools/memhog)" in d.text
    assert "cannot see" not in d.text  # all memory is accounted for by processes this session sees


def test_recorded_h100_idle_dmon_is_idle():
    facts = _facts(FIXTURES / "smi_text" / "q-h100-80gb-hbm3-vm-590.48.01-idle.txt")
    samples = _dmon_series((FIXTURES / "smi_text" / "dmon-h100-vm-idle-590.48.01.txt").read_text(), facts)
    assert [s.util_pct for s in samples] == [0] * 5 and samples[0].sm_mhz == 345
    d = diagnose_gpu(samples, facts, _seen(facts))
    assert d.state == "idle" and d.text == "idle: nothing runs on it (0% utilization, 0.0 GiB used)"


def test_recorded_rtx4090_at_its_default_limit_is_not_power_capped():
    facts = _facts(FIXTURES / "smi_text" / "q-8x-rtx4090-swpowercap-535.154.05.txt", index=1)
    assert facts.clocks.event_reasons == ["sw_power_cap"] and facts.power.default_limit_w == 450
    d = diagnose_gpu(_snapshot_series(facts), facts, _seen(facts))
    assert d.state == "ok", d.text
    assert "445 W = 99% of the limit" in d.text and "at its power limit" in d.text


def test_recorded_h100_with_thermal_and_power_brake_flags():
    # gpu2 of a real 8x H100 VM capture: SW thermal slowdown and HW power brake active while idle.
    facts = _facts(FIXTURES / "smi_text" / "q-8x-h100-sxm-vm-swpowercap-535.183.01.txt", index=2)
    d = diagnose_gpu(_snapshot_series(facts), facts, _seen(facts))
    assert d.state == "thermal"
    assert d.text == "thermal: util 0%, SM clock at 100% of max, SW thermal slowdown active (39 C)"
    assert d.also == ("hw_slowdown", "underused")  # its python process holds 9 GiB and computes nothing


def test_recorded_v100s_snapshot_with_clocks_at_84_percent_is_not_called_held():
    # A single busy reading at 84% of max clock and 47% of the power limit, no reason: under
    # gpu_sustained's 85%, but a clock snapshot is too noisy to blame the platform; the rule wants
    # HELD_MIN_SPAN_S of readings.
    facts = _facts(FIXTURES / "smi_xml" / "v100s-pcie-32gb-x8-vm-loaded-swpowercap-460.73.01-v11.xml", index=4)
    d = diagnose_gpu(_snapshot_series(facts), facts, _seen(facts))
    assert d.state == "ok", d.text


# -- synthetic series: conditions no capture shows -------------------------------------------------

def _synthetic(n: int, every_s: float = 1.0, **fields) -> list[Sample]:
    """SYNTHETIC: n samples `every_s` apart; a field may be a value or a function of the index."""
    return [Sample(t=T0 + i * every_s, **{k: (v(i) if callable(v) else v) for k, v in fields.items()}) for i in range(n)]


def _gpu(**kw) -> Gpu:
    gpu = Gpu(index=0, name="NVIDIA GeForce RTX 4090")
    gpu.clocks.max_sm_mhz = kw.get("max_sm", 3105)
    gpu.power.default_limit_w = kw.get("default_w", 450.0)
    gpu.power.enforced_limit_w = kw.get("limit_w", 450.0)
    gpu.thermal.slowdown_c = kw.get("slowdown_c")
    return gpu


def _yours(mib: int = 9000) -> list[GpuProcessSeen]:
    return [GpuProcessSeen(4242, mib, True, None, "python")]


def test_synthetic_power_cap_on_a_real_rtx4090s_facts():
    facts = _facts(FIXTURES / "smi_text" / "q-8x-rtx4090-swpowercap-535.154.05.txt", index=1)
    samples = _synthetic(60, power_w=298.0, power_limit_w=300.0, sm_mhz=2205, util_pct=99, temp_c=61.0,
                         mem_used_mib=21608, reasons=0x4)
    d = diagnose_gpu(samples, facts, _seen(facts))
    assert d.state == "power_capped"
    assert d.text == "power-capped: holding 298 W = 66% of the 450 W default (limit set to 300 W); SM clock at 88% of max"
    assert (d.evidence["power_limit_w"], d.evidence["default_limit_w"]) == (300.0, 450.0)


def test_synthetic_cap_that_does_not_bind_is_not_reported():
    samples = _synthetic(60, power_w=150.0, power_limit_w=300.0, sm_mhz=3000, util_pct=99, mem_used_mib=9000)
    assert diagnose_gpu(samples, _gpu(limit_w=300.0), _yours()).state == "ok"


def _busy_then_waiting(i: int) -> int:
    return 100 if i % 5 < 3 else 0  # busy 3 s of every 5: idle 40%


def test_synthetic_input_bound_with_eight_busy_workers():
    samples = _synthetic(60, util_pct=_busy_then_waiting, sm_mhz=2700, power_w=300.0, power_limit_w=450.0, mem_used_mib=9000)
    host = [HostSample(t=T0 + i, cpu_pct=60.0, steal_pct=0.5, iowait_pct=1.0, cpu_count=16, workers=8, workers_cpu_pct=100.0)
            for i in range(60)]
    d = diagnose_gpu(samples, _gpu(), _yours(), host)
    assert d.state == "input_bound"
    assert d.text == "input-bound: GPU idle 40% of the last minute while 8 worker processes use 100% CPU each"
    assert d.evidence["workers"] == 8 and d.evidence["idle_pct"] == 40.0


def test_synthetic_input_bound_by_busy_cpus_without_workers():
    samples = _synthetic(30, util_pct=_busy_then_waiting, sm_mhz=2700, power_w=300.0, power_limit_w=450.0)
    host = [HostSample(t=T0 + i, cpu_pct=97.0, steal_pct=0.0, iowait_pct=0.0) for i in range(30)]
    d = diagnose_gpu(samples, _gpu(), _yours(), host)
    assert d.text == "input-bound: GPU idle 40% of the last 29 s while the CPUs are 97% busy"


@pytest.mark.parametrize("host, state, words", [
    (dict(cpu_pct=70.0, steal_pct=22.0, iowait_pct=0.0), "cpu_steal", "while the hypervisor takes 22% of CPU time (steal)"),
    (dict(cpu_pct=20.0, steal_pct=0.0, iowait_pct=35.0), "io_bound", "while the CPUs wait on storage 35% of the time"),
    (dict(cpu_pct=12.0, steal_pct=0.0, iowait_pct=1.0), "underused", "the host is not the bottleneck (CPU 12%, 0 worker processes)"),
])
def test_synthetic_starved_gpu_and_what_the_host_says(host, state, words):
    samples = _synthetic(60, util_pct=_busy_then_waiting, sm_mhz=2700, power_w=300.0, power_limit_w=450.0, mem_used_mib=9000)
    d = diagnose_gpu(samples, _gpu(), _yours(), [HostSample(t=T0 + i, **host) for i in range(60)])
    assert d.state == state and words in d.text and "GPU idle 40% of the last minute" in d.text


def test_synthetic_starved_gpu_without_host_readings_is_underused():
    samples = _synthetic(60, util_pct=_busy_then_waiting, sm_mhz=2700, power_w=300.0, power_limit_w=450.0)
    d = diagnose_gpu(samples, _gpu(), _yours())
    assert d.text == "underused: GPU idle 40% of the last minute"


def test_synthetic_thermal_slowdown_under_full_load():
    samples = _synthetic(60, util_pct=100, sm_mhz=1230, power_w=260.0, power_limit_w=450.0, temp_c=86.0, reasons=0x40)
    d = diagnose_gpu(samples, _gpu(max_sm=1980, slowdown_c=88.0), _yours())
    assert d.text == "thermal: util 100% but SM clock at 62% of max, HW thermal slowdown active (86 C, 2 C from slowdown)"


def test_synthetic_power_brake_under_load_is_clocks_cut():
    samples = _synthetic(60, util_pct=100, sm_mhz=990, power_w=250.0, power_limit_w=700.0, temp_c=55.0, reasons=0x80)
    d = diagnose_gpu(samples, _gpu(max_sm=1980, default_w=700.0, limit_w=700.0, slowdown_c=88.0), _yours())
    assert d.state == "hw_slowdown"
    assert d.text.startswith("clocks cut: util 100% but SM clock at 50% of max, HW power brake active (hardware:")


def test_synthetic_hot_without_a_reason_flag_is_thermal():
    samples = _synthetic(20, util_pct=100, sm_mhz=1500, power_w=300.0, power_limit_w=450.0, temp_c=87.0)
    d = diagnose_gpu(samples, _gpu(max_sm=1980, slowdown_c=89.0), _yours())
    assert d.state == "thermal" and "at the slowdown temperature (87 C, 2 C from slowdown)" in d.text


def test_synthetic_brief_flag_is_a_blip_not_a_diagnosis():
    # HW thermal slowdown in 2 of 60 samples (3%): under gpu_sustained's FAULT_SHARE of 5%.
    samples = _synthetic(60, util_pct=100, sm_mhz=2700, power_w=400.0, power_limit_w=450.0, temp_c=70.0,
                         reasons=lambda i: 0x40 if i in (10, 11) else 0)
    assert diagnose_gpu(samples, _gpu(slowdown_c=88.0), _yours()).state == "ok"


def test_a_geforce_at_its_boost_clock_is_not_held_back():
    # An RTX 4090 busy at 2580 MHz (its 2520 MHz boost and a little over) with power to spare: 83% of
    # NVML's 3105 MHz ceiling read as "clocks held" before.
    samples = _synthetic(60, util_pct=98, sm_mhz=2580, power_w=380.0, power_limit_w=450.0, mem_used_mib=9000)
    assert diagnose_gpu(samples, _gpu(), _yours()).state == "ok"


def test_synthetic_clocks_held_with_power_to_spare():
    samples = _synthetic(60, util_pct=98, sm_mhz=1600, power_w=180.0, power_limit_w=450.0, reasons=0x2)
    d = diagnose_gpu(samples, _gpu(), _yours())
    assert d.state == "clocks_held"
    # Of the RTX 4090's 2520 MHz boost clock, its rated clock under load (NVML's 3105 MHz max is a ceiling).
    assert d.text.startswith("clocks held: util 98% but SM clock at 63% of max while drawing 40% of the power limit")
    assert "nvidia-smi -rac" in d.text


def test_synthetic_heat_soak_over_ten_minutes_is_slower_and_slower():
    # SYNTHETIC 10-minute soak at 1 Hz: SM clock drifts from 1980 to 1683 MHz while the GPU heats 60 -> 72 C.
    samples = _synthetic(601, util_pct=100, sm_mhz=lambda i: round(1980 - 297 * i / 600), temp_c=lambda i: 60 + 12 * i / 600,
                         power_w=600.0, power_limit_w=700.0)
    d = diagnose_gpu(samples, _gpu(max_sm=1980, default_w=700.0, limit_w=700.0, slowdown_c=90.0), _yours())
    assert d.state == "slowing"
    assert d.text.startswith("slower and slower: throughput proxy (utilization x SM clock) down 12% over 10 min "
                             "while temperature rose 10 C (SM clock -12%, utilization +0%)")


def test_synthetic_short_drift_is_not_a_trend():
    samples = _synthetic(60, util_pct=100, sm_mhz=lambda i: 1980 - 5 * i, power_w=600.0, power_limit_w=700.0)
    assert diagnose_gpu(samples, _gpu(max_sm=1980, default_w=700.0, limit_w=700.0), _yours()).state != "slowing"


def test_thinned_trend_series_is_used_when_given():
    trend = _synthetic(600, util_pct=100, sm_mhz=lambda i: round(1980 - 297 * i / 599), power_w=600.0, power_limit_w=700.0)
    window = [Sample(t=T0 + 540 + i, util_pct=100, sm_mhz=1683, power_w=600.0, power_limit_w=700.0) for i in range(60)]
    d = diagnose_gpu(window, _gpu(max_sm=1980, default_w=700.0, limit_w=700.0), _yours(), trend=trend)
    assert d.state == "slowing" and d.evidence["samples"] == 60


def test_most_important_rule_wins_and_the_rest_are_listed():
    # SYNTHETIC: hot and starved and with hidden memory at once.
    samples = _synthetic(60, util_pct=_busy_then_waiting, sm_mhz=1200, power_w=200.0, power_limit_w=450.0,
                         temp_c=87.0, reasons=0x40, mem_used_mib=20_000)
    host = [HostSample(t=T0 + i, cpu_pct=99.0) for i in range(60)]
    d = diagnose_gpu(samples, _gpu(slowdown_c=88.0), _yours(9000), host)
    assert d.state == "thermal"
    assert d.also == ("neighbour", "input_bound")


def test_window_is_the_last_minute_only():
    # SYNTHETIC: idle for 5 minutes, then fully busy for the last minute.
    samples = _synthetic(360, util_pct=lambda i: 0 if i < 300 else 100, sm_mhz=2700, power_w=400.0, power_limit_w=450.0)
    d = diagnose_gpu(samples, _gpu(), _yours())
    assert d.state == "ok" and d.evidence["util_pct"] == 100.0


def test_no_samples_or_no_readings_is_no_data():
    assert diagnose_gpu([], _gpu()).state == "no_data"
    d = diagnose_gpu([Sample(t=T0), Sample(t=T0 + 1)], _gpu())  # SYNTHETIC: a GPU that answers nothing
    assert d.state == "no_data" and "NVML gives no utilization" in d.text


def test_unknown_processes_do_not_make_a_neighbour():
    samples = _synthetic(30, util_pct=90, sm_mhz=2700, power_w=400.0, power_limit_w=450.0, mem_used_mib=20_000)
    assert diagnose_gpu(samples, _gpu(), None).state == "ok"  # NVML could not list processes: no claim


def test_states_are_stable_label_values():
    assert set(diagnose.GPU_STATES) <= set(diagnose.STATES)
    assert all(state.isidentifier() and state.islower() for state in diagnose.STATES)
    assert {name for name, _ in diagnose.RULE_ORDER} | {"ok", "no_data", "lost"} == set(diagnose.GPU_STATES)


# -- the followed job --------------------------------------------------------------------------------

def test_job_takes_its_worst_gpu():
    gpus = {0: Diagnosis("ok", "fine"), 1: Diagnosis("power_capped", "holding 300 W"), 2: Diagnosis("underused", "idle 30%")}
    d = diagnose_job(True, gpus)
    assert d.state == "power_capped" and d.text == "power-capped: GPU 1: holding 300 W"
    assert d.also == ("underused",)


def test_job_gone_or_without_gpu():
    assert diagnose_job(False, {}).state == "job_gone"
    assert diagnose_job(True, {}).text == "no GPU: none of its processes holds a GPU"
    assert "NVML does not list GPU processes" in diagnose_job(True, {}, processes_listed=False).text


def test_job_in_a_container_takes_the_gpus_it_cannot_see_into_not_no_gpu(h100_load):
    # `watch --pid` in a container: the job's own processes are on GPU 0 under host pids.
    samples, facts = h100_load
    gpu0 = diagnose_gpu(samples, facts, _seen(facts, visible=False), following_job=True, in_container=True)
    d = diagnose_job(True, {}, True, {0: gpu0})
    assert d.state == "ok" and d.text.startswith("ok: maybe GPU 0: 100% busy")
    assert d.text.endswith("processes NVML lists are not visible in this container (PID namespace): they may be yours")
    assert "none of its processes" not in d.text and "--pid" not in d.text
    two = diagnose_job(True, {}, True, {0: gpu0, 1: Diagnosis("thermal", "HW thermal slowdown active")})
    assert two.text.startswith("thermal: maybe GPUs 0, 1 (the worst: GPU 1): HW thermal slowdown active; processes NVML")


def test_a_lost_gpu_is_lost_whatever_its_last_readings_said(h100_load):
    samples, facts = h100_load
    d = diagnose_gpu(samples, facts, _seen(facts), lost="NVML: GPU is lost")
    assert d.state == "lost" and d.text == ("lost: GPU fell off the bus (NVML: GPU is lost): check `nvidia-smi`, "
                                            "`dmesg | grep -i xid`; the job on it has failed or will")
    assert diagnose_job(True, {0: Diagnosis("thermal", "hot"), 1: d}).state == "lost"
    reset = diagnose_gpu(samples, facts, lost="NVML: GPU requires a reset")
    assert reset.text.startswith("lost: NVML can no longer read the GPU (NVML: GPU requires a reset): check `nvidia-smi`")


def test_synthetic_sixty_seconds_at_84_percent_clock_is_held():
    # The same 84% of max as the V100S snapshot above, held for a minute: gpu_sustained's 85% applies.
    samples = _synthetic(60, util_pct=98, sm_mhz=1663, power_w=180.0, power_limit_w=450.0)
    assert diagnose_gpu(samples, _gpu(max_sm=1980), _yours()).state == "clocks_held"


def test_synthetic_watch_log_changes_become_findings_by_share_of_the_watched_time():
    # SYNTHETIC diagnosis changes of a 1000 s watch: waiting 10 s for readings, then ok, power-capped
    # from 300 to 650 s, ok again; a second session of 100 s that starts power-capped.
    first = [(0.0, "no_data", "no reading"), (10.0, "ok", "ok: 99% busy"),
             (300.0, "power_capped", "power-capped: holding 300 W = 43% of the 700 W default"), (650.0, "ok", "ok: 99% busy")]
    second = [(0.0, "power_capped", "power-capped: holding 300 W = 43% of the 700 W default")]
    (capped,) = diagnose.watch_findings("gpu3", [(first, 1000.0), (second, 100.0)])
    assert (capped.check, capped.subject, capped.status) == ("watch.power_capped", "gpu3", "warn")
    assert capped.summary == "power-capped 41% of the watched time (8 min of 18 min)"  # 450 of 1090 s
    assert capped.evidence.measured.startswith("8 min of 18 min watched; first at +300 s: power-capped: holding 300 W")
    assert "nvidia-smi -pl" in capped.remedy
    (calm,) = diagnose.watch_findings("gpu0", [([(0.0, "ok", "ok"), (5.0, "idle", "idle")], 20.0)])
    assert (calm.status, calm.summary) == ("pass", "ok or idle for all 20 s watched")


def test_synthetic_a_gpu_lost_fails_the_watch_even_as_the_log_ends():
    lost = "lost: GPU fell off the bus (NVML: GPU is lost): check `nvidia-smi`"
    late = [(0.0, "ok", "ok"), (100.0, "lost", lost)]
    (found,) = [f for f in diagnose.watch_findings("gpu1", [(late, 100.0)]) if f.check == "watch.lost"]
    assert found.status == "fail" and found.summary == "the GPU was lost at +100 s (NVML could no longer read it)"
    assert "dmesg | grep -i xid" in found.remedy
    assert [f.status for f in diagnose.watch_findings("gpu1", [([(0.0, "lost", lost)], 0.0)])] == ["fail"]


def test_synthetic_a_thermal_blip_warns_and_a_long_one_fails():
    blip = [(0.0, "ok", "ok"), (100.0, "thermal", "thermal: HW thermal slowdown active"), (103.0, "ok", "ok")]
    assert [f.status for f in diagnose.watch_findings("gpu0", [(blip, 1000.0)])] == ["warn"]  # 0.3%: under FAULT_SHARE
    long = [(0.0, "ok", "ok"), (100.0, "thermal", "thermal: HW thermal slowdown active")]
    assert [f.status for f in diagnose.watch_findings("gpu0", [(long, 1000.0)])] == ["fail"]


def test_synthetic_a_half_second_snapshot_says_it_is_one():
    # `gpuvet watch --once`: two readings 0.5 s apart, the GPU idle 40% of them, 8 busy workers.
    samples = _synthetic(2, every_s=0.5, util_pct=60, sm_mhz=2700, power_w=200.0, power_limit_w=450.0)
    host = [HostSample(t=T0 + 0.5, cpu_pct=50.0, workers=8, workers_cpu_pct=100.0)]
    d = diagnose_gpu(samples, _gpu(), _yours(), host)
    assert d.text == "input-bound: GPU idle 40% of a 0.5 s snapshot while 8 worker processes use 100% CPU each"
    (one,) = samples[:1]
    assert "of a single reading (a snapshot)" in diagnose_gpu([one], _gpu(), _yours(), host).text


def test_a_watched_state_is_placed_on_the_clock_when_the_session_start_is_known():
    # SYNTHETIC diagnosis changes of one session that began 2026-12-04 00:00:00 UTC: power-capped from
    # +10800 s (03:00) until the end; "the job got slow at 3 a.m." is answered at 3 a.m., not "+10800 s".
    from datetime import datetime, timezone

    from gpuvet.judge.diagnose import watch_findings

    t0 = datetime(2026, 12, 4, tzinfo=timezone.utc).timestamp()
    rows = [(0.0, "ok", "ok"), (10800.0, "power_capped", "power-capped: holding 300 W")]
    (capped,) = watch_findings("gpu0", [(rows, 14400.0)], t0)
    assert capped.check == "watch.power_capped"
    assert "first at 2026-12-04 03:00:00 UTC (+10800 s)" in capped.evidence.measured
    (unplaced,) = watch_findings("gpu0", [(rows, 14400.0)])  # several sessions: only the offset is known
    assert "first at +10800 s" in unplaced.evidence.measured
