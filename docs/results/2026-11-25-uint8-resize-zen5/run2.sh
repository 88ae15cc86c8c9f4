#!/bin/bash
# After the uint8 resize: the request path per worker again (main), the in-process forms of ResNet-50 exported with a
# 1000-image held-out folder, then one served run per model (every body) with main's code.
set -u
cd /work/main; source .venv/bin/activate
B=/tmp/exp/bodies; BODIES=$B/cat.jpg,$B/vga.jpg,$B/2mp.jpg,$B/12mp-sideways.jpg,$B/screenshot.png
for m in lite0 r50 lite2; do
  python -m measure pipeline --export-dir /tmp/exp/$m --images $B --decode manifest --seconds 3 --out /tmp/s3/pipe2-$m > /tmp/s3/pipe2-$m.log 2>&1
done
echo "== inprocess r50v $(date +%T)"
python -m measure inprocess /tmp/s3/r50v --batches 1,8 --threads 1,2 --rounds 2 --out /tmp/s3/inproc-r50v > /tmp/s3/inproc-r50v.log 2>&1
echo "   exit $? $(date +%T)"
echo "== bench r50v $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
python -m measure bench --export-dir /tmp/s3/r50v --images $BODIES --duration 10 --concurrency 8 \
    --configurations default,fp32-onnx,openvino-bf16,litserve,kserve --inprocess /tmp/s3/inproc-r50v/bench.json --out /tmp/s3/full-r50v > /tmp/s3/full-r50v.log 2>&1
echo "   exit $? $(date +%T)"
echo "== bench lite0 $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
python -m measure bench --export-dir /tmp/exp/lite0 --images $BODIES --duration 10 --concurrency 8 \
    --configurations default,fp32-onnx,openvino-bf16,litserve,kserve --inprocess /tmp/exp/inproc-zen5/bench.json --out /tmp/s3/full-lite0 > /tmp/s3/full-lite0.log 2>&1
echo "   exit $? $(date +%T)"
