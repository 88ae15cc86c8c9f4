#!/bin/bash
# Interleaved before/after of the uint8 v2 resize on one Zen 5 (2 cores): /tmp/before is main before the change
# (5ef0c88), /work/main after it; each serves the same export with its own code (the archive ships runtime/ and
# handlers/), c=8, cat.jpg, 15 s per row after 20 s of warm-up.
set -u
PY=/work/main/.venv/bin/python
run() {  # $1 label, $2 checkout, $3 export, $4 configurations
  echo "== $1 $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  (cd $2 && $PY -m measure bench --export-dir $3 --images /work/main/examples/cat.jpg --duration 15 --concurrency 8 \
      --configurations $4 --inprocess none --pipeline none --out /tmp/s3/pairs/$1) 2>&1 | grep -E "  .* c=8 "
}
for round in 1 2; do
  run lite0-before-$round /tmp/before /tmp/exp/lite0 default,kserve
  run lite0-after-$round /work/main /tmp/exp/lite0 default,kserve
  run r50-after-$round /work/main /tmp/exp/r50 default,kserve
  run r50-before-$round /tmp/before /tmp/exp/r50 default,kserve
done
run lite2-before-1 /tmp/before /tmp/exp/lite2 default
run lite2-after-1 /work/main /tmp/exp/lite2 default
