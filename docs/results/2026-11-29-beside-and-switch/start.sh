#!/usr/bin/env bash
# Ray Serve's start, the code before (BEFORE, a worktree of 54d65a6) and after, alternately, the choice at load kept
# from an earlier start (--warm):  STORE=DIR OUT=DIR BEFORE=WORKTREE docs/results/2026-11-29-beside-and-switch/start.sh
set -uo pipefail
mkdir -p "$OUT"
AFTER=$(cd "$(dirname "$0")/../../.." && pwd)
for round in 1 2; do
  for code in before after; do
    tree=$([ "$code" = before ] && echo "$BEFORE" || echo "$AFTER")
    echo "$code $round $(uptime)" >> "$OUT/load-start.txt"
    (cd "$tree" && .venv/bin/python -m measure start --store "$STORE" --engine ray --port 18200 --runs 2 --warm \
      --out "$OUT/start-$code-$round") > "$OUT/start-$code-$round.log" 2>&1
  done
done
