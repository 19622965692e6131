#!/usr/bin/env bash
# Download, here, every wheel bench/gpu_check.sh needs on the GPU machine beyond its image's
# packages: bench/gpu_requirements.txt, as CPython 3.12 manylinux x86-64 wheels, into .whl/
# (git-ignored). That machine reaches no package registry: a device call names `.whl` in its
# carry list and the check installs them with `pip install --no-index --no-deps --target`.
#
#   bash bench/gpu_wheels.sh            # from anywhere; PYTHON=... picks the pip to download with
#
# The working tree and everything carried travel in at most 64 MiB, so this stops (exit 1) when
# the folder passes WHEELS_MAX_MIB (default 40). It prints the total size either way.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
MAX_MIB="${WHEELS_MAX_MIB:-40}"

rm -rf .whl
mkdir -p .whl
# --no-deps: the list is complete by design (tests/bench/test_gpu_imports.py proves the import
# set), and pip resolving here would pull in what the image already holds, at other versions.
# pip matches a manylinux tag exactly, so the usual ones are named; pure-Python wheels match any.
"$PY" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .whl -r bench/gpu_requirements.txt 2> >(grep -v 'is ignored: it is neither a file' >&2)

# One version of each: two of one name stop the whole install there.
dupes=$(ls .whl/*.whl | sed -E 's#.*/##; s#-[0-9].*##' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dupes" ]; then
  echo "gpu_wheels: more than one wheel of: $dupes" >&2
  exit 1
fi
count=$(ls .whl/*.whl | wc -l)
bytes=$(du -cb .whl/*.whl | tail -n 1 | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "gpu_wheels: $count wheels in .whl/, $mib MiB in all (limit $MAX_MIB MiB of the 64 MiB a device call carries)"
awk -v b="$bytes" -v m="$MAX_MIB" 'BEGIN { exit !(b <= m * 1048576) }' || {
  echo "gpu_wheels: over $MAX_MIB MiB" >&2
  exit 1
}
