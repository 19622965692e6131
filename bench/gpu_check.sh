#!/usr/bin/env bash
# The GPU checks of gpu_runtime, as one script for a session that has a CUDA machine:
# the CUDA-marked tests, then the cost benchmark (bench/arms.py --json) on the GPU.
#
#   bash bench/gpu_check.sh            # from the repository root
#   PYTHON=/path/to/python bash bench/gpu_check.sh
#
# Bounded: tests 150 s, benchmark (--quick: 3 rounds x 12 steps, compile included) 270 s, so the whole stays under about 7 minutes
# (the device budget counts every second). Results go to $OUT (or ./var/gpu_check)
# as profile.json, cuda_tests.txt, arms.txt and arms.json (the benchmark's last line).
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-var/gpu_check}"
mkdir -p "$OUT_DIR"

# The first interpreter whose torch sees a GPU: $PYTHON, the project venv, then the system's.
PY=""
for candidate in "${PYTHON:-}" .venv/bin/python python3 python; do
  [ -n "$candidate" ] || continue
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PY="$candidate"; break
  fi
done
if [ -z "$PY" ]; then
  echo "no python with a CUDA-enabled torch found (set PYTHON=...)" | tee "$OUT_DIR/error.txt"
  exit 2
fi

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  "$PY" -c 'import triton; print("triton", triton.__version__)' 2>/dev/null || echo "triton: not installed"
  "$PY" -c 'import bitsandbytes; print("bitsandbytes", bitsandbytes.__version__)' 2>/dev/null \
    || echo "bitsandbytes: not installed (int8 uses the PyTorch path)"
} | tee "$OUT_DIR/environment.txt"

# The device profile (gpu_runtime.profile): NVML's SKU name, memory, power limit, GPM support, and
# GEMM GFLOP/s per dtype; what `precision.compute_dtype: auto` resolves to on this GPU.
echo "== device profile"
timeout 60 "$PY" -m gpu_runtime profile --device cuda:0 --json > "$OUT_DIR/profile.json" 2> "$OUT_DIR/profile.err"
profile_rc=$?
"$PY" -c 'import json, sys; p = json.load(open(sys.argv[1])); print(p["device_label"], p.get("compute_capability"), p.get("total_memory_mib"), "MiB", p.get("power_limit_w"), "W, GPM", p.get("gpm_supported"), "best", p.get("best_dtype")); [print(" ", k, v.get("gflops"), v.get("ratio_vs_fp32"), "native" if v.get("native") else "emulated") for k, v in p["dtypes"].items()]' "$OUT_DIR/profile.json" 2>&1 | tee "$OUT_DIR/profile.txt"

# Only gpu_runtime's conftest (--confcutdir): the suite's root conftest needs Django, this machine may not have it.
echo "== CUDA tests"
timeout 150 "$PY" -m pytest -c /dev/null --confcutdir=tests/gpu_runtime -p no:django -p no:cacheprovider \
  -o "markers=cuda: needs a CUDA device" \
  -m cuda tests/gpu_runtime -q -rs 2>&1 | tee "$OUT_DIR/cuda_tests.txt"
tests_rc=${PIPESTATUS[0]}

echo "== bench/arms.py on CUDA"
timeout 270 "$PY" bench/arms.py --device cuda --quick --json 2>&1 | tee "$OUT_DIR/arms.txt"
bench_rc=${PIPESTATUS[0]}
tail -n 1 "$OUT_DIR/arms.txt" > "$OUT_DIR/arms.json"

echo "profile rc=$profile_rc, cuda tests rc=$tests_rc (124: timed out), arms rc=$bench_rc" | tee "$OUT_DIR/summary.txt"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
