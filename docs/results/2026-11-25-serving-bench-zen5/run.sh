#!/bin/bash
# After the pairs: the in-process run of Lite2, then one full served run per model (every configuration, every body).
set -u

cd /work/main; source .venv/bin/activate
B=/tmp/exp/bodies; BODIES=$B/cat.jpg,$B/vga.jpg,$B/2mp.jpg,$B/12mp-sideways.jpg,$B/screenshot.png


for m in r50 lite0 lite2; do
  case $m in
    r50) CONF=default,int8,openvino-int8,openvino-bf16,litserve,kserve; IN=/tmp/exp/inproc-zen5/bench.json;;
    lite0) CONF=default,fp32-onnx,openvino-bf16,openvino-int8,litserve,kserve; IN=/tmp/exp/inproc-zen5/bench.json;;
    lite2) CONF=default,fp32-onnx,int8,openvino-bf16,litserve,kserve; IN=/tmp/exp/inproc-lite2/bench.json;;
  esac
  echo "== bench $m $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  python -m measure bench --export-dir /tmp/exp/$m --images $BODIES --duration 10 --concurrency 8 --configurations $CONF \
      --inprocess $IN --out /tmp/exp/full-$m > /tmp/exp/full-$m.log 2>&1
  echo "   exit $? $(date +%T)"
done
