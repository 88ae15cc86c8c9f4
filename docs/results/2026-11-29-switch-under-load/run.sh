#!/usr/bin/env bash
# A rollout and a rollback of EfficientNet-Lite0 under 8 clients on each engine, on a quiet machine:
#   STORE=DIR OUT=DIR docs/results/2026-11-29-switch-under-load/run.sh
# STORE holds efficientnet-lite0.mar and .v1.mar (v1, live) and efficientnet-lite0.v2.mar (the same export archived
# again); each rollout ends with a rollback, so the store is as it was for the next engine.
set -euo pipefail
mkdir -p "$OUT"
grep -o 'avx512[a-z_]*\|avx2\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu.txt"
for engine in torchserve kserve ray; do
  uptime >> "$OUT/load.txt"
  python -m measure rollout --engine "$engine" --model-store "$STORE" --model efficientnet-lite0 --live v1 \
    --candidate "$STORE/efficientnet-lite0.v2.mar" --steady 10 --accept-weak-evidence \
    --out "$OUT/rollout-$engine" > "$OUT/rollout-$engine.log" 2>&1 || echo "rollout $engine: exit $?" >> "$OUT/failed.txt"
done
uptime >> "$OUT/load.txt"
