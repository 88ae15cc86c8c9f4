#!/bin/bash
# Interleaved before/after of the serving frame on one Zen 5 (2 cores): the checkout before this session (e8d5f15,
# /tmp/before, with only main's 20 s warm-up patched into its bench) and main, each serving the same export with
# its own code (the archive ships runtime/ and handlers/), c=8, cat.jpg, 15 s per row after 20 s of warm-up.
set -u
PY=/work/main/.venv/bin/python
run() {  # $1 label, $2 checkout, $3 export, $4 configurations
  echo "== $1 $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  (cd $2 && $PY -m measure bench --export-dir $3 --images /work/main/examples/cat.jpg --duration 15 --concurrency 8 \
      --configurations $4 --inprocess none --pipeline none --out /tmp/exp/pairs2/$1) 2>&1 | grep -E "  .* c=8 "
}
for round in 1 2; do
  run lite0-before-$round /tmp/before /tmp/exp/lite0 default,kserve
  run lite0-after-$round /work/main /tmp/exp/lite0 default,kserve
  run r50-after-$round /work/main /tmp/exp/r50 default,kserve
  run r50-before-$round /tmp/before /tmp/exp/r50 default,kserve
done
