#!/usr/bin/env bash
# Every figure of this page, one engine after the other on a quiet machine:
#   STORE_LITE0=DIR STORE_R50=DIR OUT=DIR docs/results/2026-11-28-ready-in-seconds/run.sh
# STORE_LITE0 holds efficientnet-lite0.mar (v1) and efficientnet-lite0.v2.mar (the same export archived again).
set -euo pipefail
mkdir -p "$OUT"
uptime > "$OUT/load-before.txt"
for store in "$STORE_LITE0" "$STORE_R50"; do
  for engine in torchserve kserve ray; do
    python -m measure start --store "$store" --engine "$engine" --port 18200 --runs 2 \
      --out "$OUT/start-$(basename "$store")-$engine" > "$OUT/start-$(basename "$store")-$engine.log" 2>&1
    uptime >> "$OUT/load-start.txt"
  done
done
for engine in torchserve kserve ray; do
  python -m measure rollout --engine "$engine" --model-store "$STORE_LITE0" --model efficientnet-lite0 --live v1 \
    --candidate "$STORE_LITE0/efficientnet-lite0.v2.mar" --steady 10 --accept-weak-evidence \
    --out "$OUT/rollout-$engine" > "$OUT/rollout-$engine.log" 2>&1 || echo "rollout $engine: exit $?" >> "$OUT/failed.txt"
  uptime >> "$OUT/load-rollout.txt"
done
for engine in torchserve kserve ray; do
  python -m measure faults --engine "$engine" --model-store "$STORE_LITE0" --model efficientnet-lite0 --out "$OUT/faults-$engine" \
    > "$OUT/faults-$engine.log" 2>&1 || echo "faults $engine: exit $?" >> "$OUT/failed.txt"
  uptime >> "$OUT/load-faults.txt"
done
