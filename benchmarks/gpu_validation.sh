#!/usr/bin/env bash
# One prepared run on a real GPU machine (the device tool's H200): what each GPU benchmark claims,
# proved against peers and absolute targets (issue 24). Needs torch with CUDA, nvidia-ml-py,
# psutil, rich and click on the machine (no package registry); run from the repository root:
#
#     OUT=/tmp/out PYTHONPATH=src bash benchmarks/gpu_validation.sh
#     STEPS=gil,summary OUT=/tmp/out bash benchmarks/gpu_validation.sh   # rerun one step (and the summary)
#     PLAN_ONLY=1 bash benchmarks/gpu_validation.sh                      # the plan and its budget, nothing run
#
# Steps (cap in seconds; the sum stays inside BUDGET_S, default 420, minus the packing reserve):
#   captures  nvidia-smi -q/-x/topo/nvlink, lspci, sysfs links       (new real fixtures)
#   run       the default `gpuvet run`, with an independent `nvidia-smi -lms` logger alongside
#   gemm      plain torch at mamf-finder's published H200 shapes (its method: mean of 100 after 50)
#   copies    plain torch device copy; pinned host copies from the GPU's NUMA node and from another
#   context   first CUDA call of fresh processes, alone and while another process holds the GPU
#   gil       gpuvet's timing loop alone and beside 7 busy Python threads (an 8-GPU box's timers)
#   summary   every gpu.* finding against its absolute target, each peer against gpuvet's figure,
#             the logger against gpuvet's telemetry
#
# What comes back: everything is kept in a work folder and packed into ONE archive,
# $OUT/gpu-validation.tar.gz (repacked after every step, so a run cut short still returns what it
# had), plus $OUT/summary.txt (also printed). Without a GPU the GPU steps say why and are skipped.
set -uo pipefail
OUT=${OUT:-gpu-validation-out}
export PYTHONPATH=${PYTHONPATH:-src}
export PYTHONUNBUFFERED=1  # a step cut off by its cap keeps what it printed
py=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-420}
PACK_RESERVE_S=20
ALL_STEPS="captures run gemm copies context gil summary"
STEPS=${STEPS:-$ALL_STEPS}
STEPS=${STEPS//,/ }
declare -A CAP=([captures]=30 [run]=160 [gemm]=60 [copies]=40 [context]=50 [gil]=30 [summary]=20)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
steps_py="$here/gpu_validation_steps.py"

wanted() { [[ " $STEPS " == *" $1 "* ]]; }

plan_total=0
for s in $STEPS; do
  [[ -n "${CAP[$s]:-}" ]] || { echo "unknown step '$s' (steps: $ALL_STEPS)" >&2; exit 2; }
  plan_total=$((plan_total + CAP[$s]))
done
echo "plan: $(for s in $STEPS; do printf '%s %ss; ' "$s" "${CAP[$s]}"; done)total ${plan_total} s + ${PACK_RESERVE_S} s packing of ${BUDGET_S} s"
if (( plan_total + PACK_RESERVE_S > BUDGET_S )); then
  echo "the plan does not fit its budget: ${plan_total} + ${PACK_RESERVE_S} > ${BUDGET_S} s" >&2
  exit 2
fi
[[ -n "${PLAN_ONLY:-}" ]] && exit 0

mkdir -p "$OUT"
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-validation.XXXXXX")
W="$WORK/gpu-validation"
mkdir -p "$W"
if [[ -f "$OUT/gpu-validation.tar.gz" ]] && [[ "$STEPS" != "$ALL_STEPS" ]]; then
  tar -xzf "$OUT/gpu-validation.tar.gz" -C "$WORK" 2>/dev/null  # a rerun of one step keeps the others' results
fi
SUMMARY="$OUT/summary.txt"
touch "$W/notes.txt"

exec 3>&1  # the console: notes reach it even from a step whose output goes to a file
note() { echo "$*" >> "$W/notes.txt"; echo "$*" >&3; }
STEP_END=$DEADLINE
# step NAME: announce it; its commands together keep to the step's cap (CAP[NAME]).
step() {
  STEP_END=$(( $(date +%s) + ${CAP[$1]:-0} ))
  echo "== $1 (cap ${CAP[$1]:-?} s, t+$(( $(date +%s) - START )) s)" | tee -a "$W/steps.log" >&3
}
pack() { tar -czf "$OUT/gpu-validation.tar.gz.part" -C "$WORK" gpu-validation 2>/dev/null \
           && mv "$OUT/gpu-validation.tar.gz.part" "$OUT/gpu-validation.tar.gz"; }

# capped SECONDS NAME CMD...: run CMD with at most SECONDS, and less if its step's cap or the
# budget is running out. Returns 124 when it was cut off; skips (rc 125) when under 5 s are left.
capped() {
  local cap=$1 name=$2; shift 2
  local now left
  now=$(date +%s)
  left=$((DEADLINE - PACK_RESERVE_S - now))
  (( STEP_END - now < left )) && left=$((STEP_END - now))
  (( left < cap )) && cap=$left
  if (( cap < 5 )); then
    note "SKIPPED $name: out of time (budget ${BUDGET_S} s)"
    return 125
  fi
  timeout -k 5 "$cap" "$@"
  local rc=$?
  (( rc == 124 || rc == 137 )) && note "CUT OFF $name after ${cap} s"
  return $rc
}

cuda=no
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1 && cuda=yes
[[ $cuda == yes ]] || note "no CUDA device for torch: GPU steps skipped"
export GPU0_BUS=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0 2>/dev/null || true)

if wanted captures; then
step captures
if command -v nvidia-smi > /dev/null; then
  capped 10 "nvidia-smi -q -x" nvidia-smi -q -x > "$W/nvidia-smi-q-x.xml" 2>&1
  capped 10 "nvidia-smi -q" nvidia-smi -q > "$W/nvidia-smi-q.txt" 2>&1
  capped 5 "nvidia-smi topo -m" nvidia-smi topo -m > "$W/nvidia-smi-topo-m.txt" 2>&1
  capped 5 "nvidia-smi nvlink -s" nvidia-smi nvlink -s > "$W/nvidia-smi-nvlink-s.txt" 2>&1
  capped 5 "nvidia-smi" nvidia-smi > "$W/nvidia-smi.txt" 2>&1
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
  capped 10 "lspci -vv" "$lspci_bin" -vv > "$W/lspci-vv.txt" 2>&1
  for bus in $buses; do
    short=${bus#00000000:}
    capped 5 "lspci -vv -s $short" "$lspci_bin" -vv -s "${short,,}" > "$W/lspci-vv-${short//:/_}.txt" 2>&1
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

capped 20 "torch facts" "$py" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_arch_list())" \
  > "$W/torch.txt" 2>&1
if [[ -s "$W/nvidia-smi-q-x.xml" ]] && command -v nvidia-smi > /dev/null; then
  captures=("$W/nvidia-smi-q-x.xml" "$W/nvidia-smi-topo-m.txt")
  [[ -s "$W/lspci-vv.txt" ]] && captures+=("$W/lspci-vv.txt")
  capped 20 "gpuvet inspect" "$py" -m gpuvet inspect "${captures[@]}" --json > "$W/inspect.json" 2> "$W/inspect.err"
  echo "inspect of the captures (must judge without error): exit $?" >> "$W/steps.log"
fi
pack
fi

if wanted run; then
  step run
  if [[ $cuda == yes ]]; then
    logger=""
    if command -v nvidia-smi > /dev/null; then  # independent of gpuvet: NVML read by nvidia-smi every 200 ms
      nvidia-smi --query-gpu=timestamp,index,power.draw,clocks.sm,temperature.gpu,utilization.gpu \
        --format=csv,noheader,nounits -lms 200 > "$W/smi-log.csv" 2> "$W/smi-log.err" &
      logger=$!
    fi
    t0=$(date +%s)
    capped 150 "gpuvet run" "$py" -m gpuvet run --no-save --json --out "$W/run.json" > /dev/null 2> "$W/run.err"
    echo "$?" > "$W/run.rc"
    echo "$(( $(date +%s) - t0 ))" > "$W/run.wall_s"
    [[ -n "$logger" ]] && kill "$logger" 2> /dev/null
    echo "default run wall time: $(cat "$W/run.wall_s") s (exit $(cat "$W/run.rc"))" | tee -a "$W/steps.log"
    [[ -s "$W/run.json" ]] && capped 10 "gpuvet report" "$py" -m gpuvet report "$W/run.json" > "$W/run-report.txt" 2>&1
  else
    note "run: skipped, no CUDA device"
  fi
  pack
fi

# gpu_step NAME: a measuring step of gpu_validation_steps.py, its JSON line kept as NAME.json.
gpu_step() {
  local name=$1 sub=$2
  wanted "$name" || return 0
  step "$name"
  if [[ $cuda == yes ]]; then
    capped "${CAP[$name]}" "$name" "$py" "$steps_py" "$sub" > "$W/$sub.json" 2> "$W/$sub.err"
    echo "$name: exit $?" >> "$W/steps.log"
  else
    note "$name: skipped, no CUDA device"
  fi
  pack
}
gpu_step gemm gemm-peers
gpu_step copies copies
gpu_step context context
gpu_step gil gil

if wanted summary; then
  step summary
  capped 20 "summary" "$py" "$steps_py" summary "$W" > "$W/summary.txt" 2>&1
  {
    wall=$(cat "$W/run.wall_s" 2>/dev/null)
    [[ -n "$wall" ]] && echo "default gpuvet run: ${wall} s wall, exit $(cat "$W/run.rc") (target < 120 s) $( (( wall < 120 )) && echo PASS || echo FAIL)"
    sed 's/^/note: /' "$W/notes.txt"
  } >> "$W/summary.txt"
  pack
  cp "$W/summary.txt" "$SUMMARY"
fi
size=$(du -k "$OUT/gpu-validation.tar.gz" 2>/dev/null | cut -f1)
echo "archive: gpu-validation.tar.gz, ${size:-?} KiB; total $(( $(date +%s) - START )) s of ${BUDGET_S} s" >> "$SUMMARY"
[[ -f "$SUMMARY" ]] && { echo "===== summary ($SUMMARY)"; cat "$SUMMARY"; }
rm -rf "$WORK"
