#!/usr/bin/env bash
# One prepared run on a real GPU machine (e.g. the device tool's H200): everything the GPU issues
# ask to see for real, written under $OUT (default ./gpu-validation). Needs torch with CUDA,
# nvidia-ml-py, psutil, rich and click on the machine; run from the repository root:
#
#     OUT=/tmp/out PYTHONPATH=src bash benchmarks/gpu_validation.sh
#
# It captures the machine (new real fixtures for tests/fixtures, describe them in SOURCES.md),
# runs the default `gpuvet run`, and measures the peers gpuvet's figures are held against:
# a long GEMM sweep (target: gpuvet's bf16 >= 95% of its best), a plain torch device copy
# (target: gpuvet's membw >= 95% of it), the workload's resume tolerance, and the default
# run's wall time (target: under 120 s).
set -uo pipefail
OUT=${OUT:-gpu-validation}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src}
py=${PYTHON:-python3}
step() { echo "== $* ($(date -u +%T))" | tee -a "$OUT/steps.log"; }

step "captures"
nvidia-smi -q -x > "$OUT/nvidia-smi-q-x.xml" 2>&1
nvidia-smi -q > "$OUT/nvidia-smi-q.txt" 2>&1
nvidia-smi topo -m > "$OUT/nvidia-smi-topo-m.txt" 2>&1
nvidia-smi nvlink -s > "$OUT/nvidia-smi-nvlink-s.txt" 2>&1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
lspci -vv > "$OUT/lspci-vv.txt" 2>&1
for bus in $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null); do
  short=${bus#00000000:}
  lspci -vv -s "${short,,}" > "$OUT/lspci-vv-${short//:/_}.txt" 2>&1
done
"$py" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_arch_list())" > "$OUT/torch.txt" 2>&1

step "gpuvet inspect of the captures (must judge without error)"
"$py" -m gpuvet inspect "$OUT/nvidia-smi-q-x.xml" "$OUT/nvidia-smi-topo-m.txt" "$OUT/lspci-vv.txt" --json \
  > "$OUT/inspect.json" 2> "$OUT/inspect.err"

step "gpuvet run (default profile), timed"
start=$(date +%s)
"$py" -m gpuvet run --no-save --json --out "$OUT/run.json" > /dev/null 2> "$OUT/run.err"
echo "default run wall time: $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.log"
"$py" -m gpuvet report "$OUT/run.json" > "$OUT/run-report.txt" 2>&1
"$py" -m gpuvet report "$OUT/run.json" --format html --out "$OUT/run.html" > /dev/null 2>&1

step "reference GEMM sweep and plain torch copy"
"$py" benchmarks/gemm_vs_torch.py --device cuda > "$OUT/gemm_vs_torch.txt" 2>&1
"$py" - > "$OUT/plain_copy.txt" 2>&1 <<'EOF'
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

step "workload resume tolerance (healthy vs another seed)"
"$py" -m gpuvet.bench.workload --device cuda:0 --peak-tflops 989 --path /tmp > "$OUT/workload-healthy.json" 2>&1
"$py" -m gpuvet.bench.workload --device cuda:0 --peak-tflops 989 --path /tmp --tamper seed > "$OUT/workload-seed.json" 2>&1

step "done"
ls -la "$OUT" >> "$OUT/steps.log"
