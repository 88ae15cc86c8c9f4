#!/usr/bin/env bash
# A rollout and a rollback of EfficientNet-Lite0 under 8 clients on Ray Serve, the code before and after the
# rollout went through the server process, alternately (before, after, before, after) in one session:
#   STORE=DIR OUT=DIR BEFORE=WORKTREE docs/results/2026-11-29-beside-and-switch/run.sh
# BEFORE: a git worktree of the commit before (54d65a6) with the same .venv; STORE as in ../2026-11-29-switch-under-load.
set -euo pipefail
mkdir -p "$OUT"
AFTER=$(cd "$(dirname "$0")/../../.." && pwd)
grep -o 'avx512[a-z_]*\|avx2\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu.txt"
for round in 1 2; do
  for code in before after; do
    tree=$([ "$code" = before ] && echo "$BEFORE" || echo "$AFTER")
    echo "$code $round $(uptime)" >> "$OUT/load.txt"
    (cd "$tree" && .venv/bin/python -m measure rollout --engine ray --model-store "$STORE" --model efficientnet-lite0 \
      --live v1 --candidate "$STORE/efficientnet-lite0.v2.mar" --steady 10 --accept-weak-evidence \
      --out "$OUT/$code-$round") > "$OUT/$code-$round.log" 2>&1 || echo "$code $round: exit $?" >> "$OUT/failed.txt"
  done
done
echo "end $(uptime)" >> "$OUT/load.txt"
