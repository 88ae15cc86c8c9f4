#!/bin/bash
# One interleaved pair: the model alone in-process (batch 8, 1 and 2 threads), then the bench on the engine before
# the cuts and after them, same export, same bodies, default + litserve + kserve at concurrency 8.
set -u
run=$1; order=${2:-"before after"}
out=/work/art-ov/pairs/$run; mkdir -p $out
cd /work/wt-after
echo "[$(date +%T)] load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/log
PYTHONPATH=/work/wt-after /work/main/.venv/bin/python -m measure inprocess /work/art-ov/resnet50 --batches 8 --threads 1,all --out $out/inproc > $out/inproc.log 2>&1
grep -E "onnx-dynamo.*batch=8" $out/inproc.log | tee -a $out/log
for tree in $order; do
  cd /work/wt-$tree
  echo "[$(date +%T)] $tree load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/log
  PYTHONPATH=/work/wt-$tree /work/main/.venv/bin/python -m measure bench --export-dir /work/art-ov/resnet50 \
     --configurations default,litserve,kserve --concurrency 8 --duration 20 --inprocess $out/inproc/bench.json \
     --pipeline none --out $out/$tree > $out/$tree.log 2>&1
  grep -E "^\s+(default|litserve|kserve) " $out/$tree.log | tee -a $out/log
done
echo "[$(date +%T)] end load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/log
