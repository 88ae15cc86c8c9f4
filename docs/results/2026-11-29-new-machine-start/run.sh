#!/usr/bin/env bash
# A first start on a machine that never served, as `python -m measure start` now simulates it (an empty cache
# folder of the servers' own: the first worker of a model measures the choice at load, the others read what it
# kept), beside the simulation it replaces (BEFORE: a checkout whose measure start sets
# VISION_EXPORT_FORM_CHOICE=remeasure, so that every worker measures again, one after the other), on each engine,
# one after the other on one quiet machine; then warm starts (the choice kept).
#   OUT=DIR BEFORE=CHECKOUT [STORE=DIR] docs/results/2026-11-29-new-machine-start/run.sh
# STORE: a store holding Lite0 (trained); exported into OUT when not given.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
AFTER=$(cd "$HERE/../../.." && pwd)
mkdir -p "$OUT"
grep -o 'avx512[a-z_]*\|avx2\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu.txt"
if [ -z "${STORE:-}" ]; then
  STORE="$OUT/store"
  (cd "$AFTER" && .venv/bin/python -m export efficientnet --arch lite0 --out "$OUT/export" --model-store "$STORE" \
    > "$OUT/export.log" 2>&1)
fi
for engine in kserve torchserve ray; do
  uptime >> "$OUT/load.txt"
  (cd "$BEFORE" && .venv/bin/python -m measure start --store "$STORE" --engine "$engine" --port 18400 --runs 1 \
    --out "$OUT/remeasure-$engine" > "$OUT/remeasure-$engine.log" 2>&1)
  (cd "$AFTER" && .venv/bin/python -m measure start --store "$STORE" --engine "$engine" --port 18400 --runs 3 \
    --out "$OUT/new-machine-$engine" > "$OUT/new-machine-$engine.log" 2>&1)
done
grep -h "returned after" "$OUT"/*/start.md
