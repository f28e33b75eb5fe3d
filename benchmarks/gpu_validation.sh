#!/usr/bin/env bash
# One prepared run on a real GPU machine (e.g. the device tool's H200): everything the GPU issues
# ask to see for real. Needs torch with CUDA, nvidia-ml-py, psutil, rich and click on the machine;
# run from the repository root:
#
#     OUT=/tmp/out PYTHONPATH=src bash benchmarks/gpu_validation.sh
#
# It captures the machine (new real fixtures for tests/fixtures, describe them in SOURCES.md),
# runs the default `gpuvet run`, and measures the peers gpuvet's figures are held against:
# a long GEMM sweep (target: gpuvet's bf16 >= 95% of its best), a plain torch device copy
# (target: gpuvet's membw >= 95% of it), the default run's wall time (target: under 120 s), and,
# time permitting, the workload's resume tolerance.
#
# What comes back: the device tool returns at most 8 files from $OUT, so everything is kept in a
# work folder outside $OUT and packed into ONE archive, $OUT/gpu-validation.tar.gz (repacked after
# every step, so a run cut short still returns what it had), plus $OUT/summary.txt (also printed).
# The whole script keeps to BUDGET_S seconds (default 450: a 15-minute device session also pays
# the machine's start and the transfers); each step has its own cap and a step that no longer fits
# is skipped with that reason. Without a GPU it skips the GPU steps with the reason, in seconds.
set -uo pipefail
OUT=${OUT:-gpu-validation-out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src}
export PYTHONUNBUFFERED=1  # a step cut off by its cap keeps what it printed
py=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-450}
PACK_RESERVE_S=20
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-validation.XXXXXX")
W="$WORK/gpu-validation"
mkdir -p "$W"
SUMMARY="$OUT/summary.txt"
: > "$W/notes.txt"

exec 3>&1  # the console: notes reach it even from a step whose output goes to a file
note() { echo "$*" >> "$W/notes.txt"; echo "$*" >&3; }
step() { echo "== $* (t+$(( $(date +%s) - START )) s)" | tee -a "$W/steps.log" >&3; }
pack() { tar -czf "$OUT/gpu-validation.tar.gz.part" -C "$WORK" gpu-validation 2>/dev/null \
           && mv "$OUT/gpu-validation.tar.gz.part" "$OUT/gpu-validation.tar.gz"; }

# capped SECONDS NAME CMD...: run CMD with at most SECONDS, and less if the budget is running out.
# Returns 124 when it was cut off; skips (rc 125) when fewer than 10 s are left.
capped() {
  local cap=$1 name=$2; shift 2
  local left=$((DEADLINE - PACK_RESERVE_S - $(date +%s)))
  (( left < cap )) && cap=$left
  if (( cap < 10 )); then
    note "SKIPPED $name: out of time (budget ${BUDGET_S} s)"
    return 125
  fi
  timeout -k 5 "$cap" "$@"
  local rc=$?
  (( rc == 124 || rc == 137 )) && note "CUT OFF $name after ${cap} s"
  return $rc
}

step "captures"
if command -v nvidia-smi > /dev/null; then
  capped 60 "nvidia-smi -q -x" nvidia-smi -q -x > "$W/nvidia-smi-q-x.xml" 2>&1
  capped 60 "nvidia-smi -q" nvidia-smi -q > "$W/nvidia-smi-q.txt" 2>&1
  capped 30 "nvidia-smi topo -m" nvidia-smi topo -m > "$W/nvidia-smi-topo-m.txt" 2>&1
  capped 30 "nvidia-smi nvlink -s" nvidia-smi nvlink -s > "$W/nvidia-smi-nvlink-s.txt" 2>&1
  capped 30 "nvidia-smi" nvidia-smi > "$W/nvidia-smi.txt" 2>&1
  buses=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null)
else
  note "nvidia-smi not found: no NVIDIA driver here, no nvidia-smi captures"
  buses=""
fi

lspci_bin=$(command -v lspci || true)
for candidate in /sbin/lspci /usr/sbin/lspci /usr/bin/lspci; do
  [[ -z "$lspci_bin" && -x "$candidate" ]] && lspci_bin=$candidate
done
if [[ -n "$lspci_bin" ]]; then
  capped 30 "lspci -vv" "$lspci_bin" -vv > "$W/lspci-vv.txt" 2>&1
  for bus in $buses; do
    short=${bus#00000000:}
    capped 10 "lspci -vv -s $short" "$lspci_bin" -vv -s "${short,,}" > "$W/lspci-vv-${short//:/_}.txt" 2>&1
  done
  note "lspci: $lspci_bin"
else
  note "lspci MISSING (not on PATH, /sbin, /usr/sbin or /usr/bin): no lspci -vv capture; PCIe links from sysfs in pci-links.txt instead"
fi

# The GPUs' PCIe links from sysfs (idle readings: a link downshifts at idle), with or without lspci.
{
  for dev in /sys/bus/pci/devices/*; do
    [[ "$(cat "$dev/vendor" 2>/dev/null)" == 0x10de ]] || continue
    case "$(cat "$dev/class" 2>/dev/null)" in 0x03*) ;; *) continue ;; esac
    line="${dev##*/}"
    for f in current_link_speed current_link_width max_link_speed max_link_width; do
      line+=" $f=$(tr ' ' '_' < "$dev/$f" 2>/dev/null || echo n/a)"
    done
    echo "$line"
  done
} > "$W/pci-links.txt"
[[ -s "$W/pci-links.txt" ]] || echo "no NVIDIA display/3D controller in /sys/bus/pci/devices" > "$W/pci-links.txt"

capped 30 "torch facts" "$py" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_arch_list())" \
  > "$W/torch.txt" 2>&1
cuda=no
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1 && cuda=yes
[[ $cuda == yes ]] || note "no CUDA device for torch ($(tail -n 1 "$W/torch.txt")): GPU steps skipped"
pack

if [[ -s "$W/nvidia-smi-q-x.xml" ]] && command -v nvidia-smi > /dev/null; then
  step "gpuvet inspect of the captures (must judge without error)"
  captures=("$W/nvidia-smi-q-x.xml" "$W/nvidia-smi-topo-m.txt")
  [[ -s "$W/lspci-vv.txt" ]] && captures+=("$W/lspci-vv.txt")
  capped 60 "gpuvet inspect" "$py" -m gpuvet inspect "${captures[@]}" --json > "$W/inspect.json" 2> "$W/inspect.err"
  echo "inspect exit code: $?" >> "$W/steps.log"
fi

if [[ $cuda == yes ]]; then
  step "gpuvet run --plan (the forecast), then gpuvet run (default profile), timed"
  capped 60 "gpuvet run --plan" "$py" -m gpuvet run --plan --json > "$W/plan.json" 2> "$W/plan.err"
  t0=$(date +%s)
  capped 240 "gpuvet run" "$py" -m gpuvet run --no-save --json --out "$W/run.json" > /dev/null 2> "$W/run.err"
  echo "$?" > "$W/run.rc"
  echo "$(( $(date +%s) - t0 ))" > "$W/run.wall_s"
  echo "default run wall time: $(cat "$W/run.wall_s") s (exit $(cat "$W/run.rc"))" | tee -a "$W/steps.log"
  if [[ -s "$W/run.json" ]]; then
    capped 30 "gpuvet report" "$py" -m gpuvet report "$W/run.json" > "$W/run-report.txt" 2>&1
    capped 30 "gpuvet report html" "$py" -m gpuvet report "$W/run.json" --format html --out "$W/run.html" > /dev/null 2>&1
  fi
  pack

  step "plain torch device copy"
  capped 60 "plain copy" "$py" - > "$W/plain_copy.txt" 2>&1 <<'EOF'
import torch
n = 1 << 30
src = torch.ones(n, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
for _ in range(5):
    dst.copy_(src)
torch.cuda.synchronize()
rates = []
for _ in range(50):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); dst.copy_(src); b.record(); torch.cuda.synchronize()
    rates.append(2 * n / (a.elapsed_time(b) / 1000) / 1e9)
rates.sort()
print(f"plain torch device copy, read+write counted: median {rates[len(rates) // 2]:.0f} GB/s, best {rates[-1]:.0f} GB/s")
EOF
  pack

  step "reference GEMM sweep (bf16, fp8) against gpuvet's gemm"
  capped 200 "gemm sweep" "$py" benchmarks/gemm_vs_torch.py --device cuda --cuda-dtypes bf16,fp8 > "$W/gemm_vs_torch.txt" 2>&1
  pack

  step "workload resume tolerance (healthy vs another seed), if time remains"
  mkdir -p "$WORK/checkpoints"  # outside the packed folder: a checkpoint is about 1 GB
  capped 60 "workload healthy" "$py" -m gpuvet.bench.workload --device cuda:0 --steps 50 --peak-tflops 989 --path "$WORK/checkpoints" \
    > "$W/workload-healthy.json" 2>&1
  capped 60 "workload seed" "$py" -m gpuvet.bench.workload --device cuda:0 --steps 50 --peak-tflops 989 --path "$WORK/checkpoints" --tamper seed \
    > "$W/workload-seed.json" 2>&1
fi

step "summary"
"$py" - "$W" > "$W/summary.txt" 2>&1 <<'EOF'
"""The three figures issue 3 asks of a real GPU, each against its target."""
import json, re, sys
from pathlib import Path

w = Path(sys.argv[1])


def text(name):
    p = w / name
    return p.read_text(errors="replace") if p.exists() else ""


def verdict(ok):
    return "PASS" if ok else "FAIL"


measured = {}
try:
    record = json.loads(text("run.json"))
    for m in record.get("measurements", []):
        if m.get("subject") == "gpu0" and m.get("value") is not None:
            measured[m["name"]] = m["value"]
except ValueError:
    record = None

print(f"gpu: {(text('torch.txt').strip() or 'no torch facts')}")
sweep = text("gemm_vs_torch.txt")
ratio = re.search(r"bf16: ratio ([\d.]+) to the best", sweep)
in_process = re.search(r"bf16: gpuvet ([\d.]+) TFLOPS", sweep)
if ratio and in_process:
    r, value = float(ratio.group(1)), float(in_process.group(1))
    best = value / r
    line = f"bf16 GEMM: gpuvet {value:.1f} vs long sweep best {best:.1f} TFLOPS = {100 * r:.1f}% (target >= 95%) {verdict(r >= 0.95)}"
    if "gemm.bf16" in measured:
        line += f"; gpuvet run's gemm.bf16 {measured['gemm.bf16']:.1f} = {100 * measured['gemm.bf16'] / best:.1f}%"
    print(line)
    fp8 = re.search(r"fp8: ratio ([\d.]+) to the best", sweep)
    if fp8:
        print(f"fp8 GEMM: gpuvet {100 * float(fp8.group(1)):.1f}% of the long sweep's best (no target)")
else:
    print("bf16 GEMM: OPEN, no sweep result (see gemm_vs_torch.txt / notes.txt)")

plain = re.search(r"median (\d+) GB/s, best (\d+) GB/s", text("plain_copy.txt"))
if plain and "membw.copy" in measured:
    median, best = float(plain.group(1)), float(plain.group(2))
    share = measured["membw.copy"] / median
    print(f"device copy: gpuvet {measured['membw.copy']:.0f} vs plain torch copy {median:.0f} GB/s median (best {best:.0f}) "
          f"= {100 * share:.1f}% (target >= 95%) {verdict(share >= 0.95)}")
else:
    print("device copy: OPEN, " + ("no plain copy figure" if not plain else "no membw.copy in run.json"))

wall = text("run.wall_s").strip()
if wall:
    rc = text("run.rc").strip()
    print(f"default gpuvet run: {wall} s wall, exit {rc} (target < 120 s) {verdict(int(wall) < 120 and rc in ('0', '1'))}")
    try:
        forecast = json.loads(text("plan.json"))
        print(f"gpuvet run --plan forecast: {forecast['total_s']:.0f} s for {len(forecast['gpus'])} GPU(s); "
              f"real/forecast = {int(wall) / forecast['total_s']:.2f}")
        took = (record or {}).get("options", {}).get("step_wall_s", {})
        for step in forecast["steps"]:
            if not step["skipped"] and step["name"] in took:
                print(f"  {step['name']}: planned {step['budget_s']:.1f} s, took {took[step['name']]:.1f} s")
    except (ValueError, KeyError, ZeroDivisionError):
        print("gpuvet run --plan forecast: not available (see plan.err)")
else:
    print("default gpuvet run: OPEN, not run")

def resume(name):
    """workload.resume_ok of a standalone workload run (the JSON is its last stdout line)."""
    for line in reversed(text(name).splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        return next((m for m in report.get("measurements", []) if m.get("name") == "workload.resume_ok"), None)
    return None


healthy, tampered = resume("workload-healthy.json"), resume("workload-seed.json")
if healthy:
    d = healthy.get("details", {})
    print(f"workload resume (healthy): ok={healthy.get('value')} update diff {d.get('update_rel_diff')} "
          f"vs run-to-run noise {(d.get('noise') or {}).get('update')}, tolerance {(d.get('rtol') or {}).get('update')}")
if tampered:
    d = tampered.get("details", {})
    print(f"workload resume (wrong RNG seed, must fail): ok={tampered.get('value')} update diff {d.get('update_rel_diff')} "
          f"(tolerance {(d.get('rtol') or {}).get('update')}; the margin issue 3's tolerances rest on)")
if not healthy and not tampered:
    print("workload resume: OPEN, not run (see notes.txt)")

if record:
    statuses = {}
    for f in record.get("findings", []):
        statuses.setdefault(f.get("status"), []).append(f"{f.get('check')}[{f.get('subject')}]")
    for status in ("fail", "warn"):
        if statuses.get(status):
            print(f"run findings {status}: {', '.join(statuses[status])}")
for line in text("notes.txt").splitlines():
    print(f"note: {line}")
EOF
pack
cp "$W/summary.txt" "$SUMMARY"
size=$(du -k "$OUT/gpu-validation.tar.gz" 2>/dev/null | cut -f1)
echo "archive: gpu-validation.tar.gz, ${size:-?} KiB; total $(( $(date +%s) - START )) s of ${BUDGET_S} s" >> "$SUMMARY"
echo "===== summary ($SUMMARY)"
cat "$SUMMARY"
rm -rf "$WORK"
