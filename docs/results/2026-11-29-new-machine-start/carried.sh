#!/usr/bin/env bash
# After the archive carries its export's timing (form-timing.json): Lite0 exported by this checkout, then on each
# engine `measure start --runs 2`: a new machine of the export's kind (an empty cache: it reads what the archive
# carries), then warm.
#   OUT=DIR docs/results/2026-11-29-new-machine-start/carried.sh
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../.."
mkdir -p "$OUT"
grep -o 'avx512[a-z_]*\|avx2\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu.txt"
.venv/bin/python -m export efficientnet --arch lite0 --out "$OUT/export" --model-store "$OUT/store" > "$OUT/export.log" 2>&1
cp "$OUT/export/form-timing.json" "$OUT/carried-form-timing.json"
for engine in kserve torchserve ray; do
  uptime >> "$OUT/load.txt"
  .venv/bin/python -m measure start --store "$OUT/store" --engine "$engine" --port 18400 --runs 2 \
    --out "$OUT/carried-$engine" > "$OUT/carried-$engine.log" 2>&1
done
grep -h "returned after" "$OUT"/carried-*/start.md
