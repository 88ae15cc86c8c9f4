#!/usr/bin/env bash
# The batch command beside its decoding alone, the in-process ceiling of the same stages and the endpoint at its best
# concurrency, on N photo-sized JPEGs, on this one machine; report.py prints them side by side at the end.
# Run from the repository root:
#   bash docs/results/2026-11-27-batch/run.sh [WORK] [N] [MIX]
# BATCH_ALSO_RAY=1 adds the same batch through Ray Data (--address local) after the default run (about 6 min more).
# WORK (default /tmp/batch-bench) holds the export, the photos, the outputs and WORK/results (raw output);
# N (default 10000) photos; MIX the sizes' weights in turn (default vga:2,2mp:2,6mp:2,12mp:1: up to 12 MP, one photo
# in 7 at 12 MP, so that N=10000 ends within 20 minutes on 2 cores). About 0.9 MB of disk per photo.
set -euo pipefail
WORK=${1:-/tmp/batch-bench}
COUNT=${2:-10000}
MIX=${3:-vga:2,2mp:2,6mp:2,12mp:1}
DECODE_LIMIT=2000  # the decoding alone: the first 2000 photos (the same mix), a rate
HERE=docs/results/2026-11-27-batch
PY=.venv/bin/python
RESULTS=$WORK/results
P=28917  # the endpoint's ports: P to P+5
mkdir -p "$RESULTS"
: > "$RESULTS/steps.txt"
STARTED=$(date +%s)
step() { echo "== $(date -u +%H:%M:%S) $*; $(uptime | sed 's/.*load/load/')" | tee -a "$RESULTS/steps.txt"; }

step "export (resnet18, random weights: speed only; served form onnx-traced)"
if [ ! -f "$WORK/artifacts/manifest.json" ]; then
    $PY -m export resnet --arch resnet18 --weights random --out "$WORK/artifacts" --model-store "$WORK/store" \
        --formats onnx-traced > "$RESULTS/export.txt" 2>&1
fi
step "$COUNT photos, mix $MIX"
PYTHONPATH=. $PY $HERE/photos.py "$WORK" "$COUNT" "$MIX" | tee "$RESULTS/photos.txt"

step "1. python -m serving batch (this machine alone: the policy's workers as a process pool, no Ray)"
rm -rf "$WORK/out"
$PY -m serving batch "$WORK/artifacts" "$WORK/photos" --out "$WORK/out" > "$RESULTS/batch.txt" 2> "$RESULTS/batch.log"
cat "$RESULTS/batch.txt"
if [ -n "${BATCH_ALSO_RAY:-}" ]; then  # the cluster's path on a Ray of this machine's own, for comparison
    step "1b. python -m serving batch --address local (Ray Data)"
    rm -rf "$WORK/out-ray"
    $PY -m serving batch "$WORK/artifacts" "$WORK/photos" --out "$WORK/out-ray" --address local \
        > "$RESULTS/batch-ray.txt" 2> "$RESULTS/batch-ray.log"
    cat "$RESULTS/batch-ray.txt"
fi

step "2. decoding alone: the Ray Data decode tasks of --address, no model, the first $DECODE_LIMIT photos"
PYTHONPATH=. $PY $HERE/decode_only.py "$WORK/artifacts" "$WORK/photos" $DECODE_LIMIT > "$RESULTS/decode.json" \
    2> "$RESULTS/decode.log"
cat "$RESULTS/decode.json"

step "3. the in-process ceiling: python -m measure pipeline, one body per size"
$PY -m measure pipeline --export-dir "$WORK/artifacts" --images "$WORK/bodies" --decode manifest --seconds 3 \
    --out "$WORK/pipeline" > "$RESULTS/pipeline.txt" 2>&1
cat "$WORK/pipeline/pipeline.md"

step "4. the endpoint (TorchServe, this machine's serving policy): best concurrency on 200 photos, then all"
$PY -m serving --detach --model-store "$WORK/store" --models resnet18 --run-dir "$WORK/ts" --inference-port $P \
    --management-port $((P+1)) --metrics-port $((P+2)) --signals-port $((P+3)) --grpc-inference-port $((P+4)) \
    --grpc-management-port $((P+5)) --page-port 0 > "$RESULTS/endpoint-start.txt" 2>&1 \
    || { cat "$RESULTS/endpoint-start.txt"; exit 1; }
trap '$PY -m serving stop --run-dir "$WORK/ts" > /dev/null 2>&1 || true' EXIT
URL=http://127.0.0.1:$P/predictions/resnet18
: > "$RESULTS/endpoint-probe.jsonl"
for c in 4 8; do
    $PY $HERE/endpoint.py $URL "$WORK/photos" $c 200 | tee -a "$RESULTS/endpoint-probe.jsonl"
done
BEST=$($PY -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(max(r, key=lambda x: x["photos_per_s"])["concurrency"])' "$RESULTS/endpoint-probe.jsonl")
$PY $HERE/endpoint.py $URL "$WORK/photos" "$BEST" | tee "$RESULTS/endpoint.json"
$PY -m serving stop --run-dir "$WORK/ts" > /dev/null 2>&1
trap - EXIT

step "done in $(( ($(date +%s) - STARTED) / 60 )) min"
PYTHONPATH=. $PY $HERE/report.py "$WORK" | tee "$RESULTS/report.txt"
