#!/usr/bin/env bash
# The batch command beside the in-process ceiling of the same stages, the endpoint, and a two-node Ray cluster.
# Run from the repository root: bash docs/results/2026-11-27-batch/run.sh [WORK] [PHOTOS]
set -euo pipefail
WORK=${1:-/tmp/batch-bench}
COUNT=${2:-400}
HERE=docs/results/2026-11-27-batch
PY=.venv/bin/python
mkdir -p "$WORK"

# resnet18 (random weights: speed only), its served form onnx-traced, and its archive
$PY -m export resnet --arch resnet18 --weights random --out "$WORK/artifacts" --model-store "$WORK/store" \
    --formats onnx-traced
# COUNT photo-sized JPEGs, VGA / 2 MP / 6 MP / 12 MP in turn, and one body per size for measure pipeline
PYTHONPATH=. $PY $HERE/photos.py "$WORK" "$COUNT"

# 1. the batch command on this machine (a Ray of its own)
$PY -m serving batch "$WORK/artifacts" "$WORK/photos" --out "$WORK/out-local" 2>&1 | tee $HERE/batch-local.txt
# 2. the in-process ceiling of the same stages, one body per size
$PY -m measure pipeline --export-dir "$WORK/artifacts" --images "$WORK/bodies" --decode manifest --seconds 3 \
    --out "$WORK/pipeline" 2>&1 | tee $HERE/pipeline.txt
# 3. the endpoint (TorchServe, this machine's serving policy) at concurrency 4 and 8
P=28917
$PY -m serving --detach --model-store "$WORK/store" --models resnet18 --run-dir "$WORK/ts" --inference-port $P \
    --management-port $((P+1)) --metrics-port $((P+2)) --signals-port $((P+3)) --grpc-inference-port $((P+4)) \
    --grpc-management-port $((P+5)) --page-port 0
for c in 4 8; do
    $PY $HERE/endpoint.py http://127.0.0.1:$P/predictions/resnet18 "$WORK/photos" $c | tee -a $HERE/endpoint.txt
done
$PY -m serving stop --run-dir "$WORK/ts"
# 4. the batch command on the two-node cluster of measure/distributed/ (both nodes on this machine)
PYTHONPATH=. $PY $HERE/two_node.py "$WORK/artifacts" "$WORK/photos" "$WORK/out-two-node" "$WORK/nodes" 2>&1 \
    | tee $HERE/batch-two-node.txt
