#!/usr/bin/env bash
# The rollout's own figure without client load: a server started per engine and store, then
# `python -m serving rollout NAME STORE/NAME.v2.mar` (and a rollback), each printing "v2 loaded beside v1 and
# answering (S s)".  STORE_LITE0=DIR STORE_R50=DIR OUT=DIR docs/results/2026-11-28-ready-in-seconds/beside.sh
# Each store holds NAME.mar (v1) and NAME.v2.mar (the same export archived again).
set -uo pipefail
mkdir -p "$OUT"
for pair in "$STORE_LITE0:efficientnet-lite0" "$STORE_R50:resnet50"; do
  store=${pair%%:*}; name=${pair##*:}
  for engine in torchserve kserve ray; do
    run_dir=$(mktemp -d /tmp/beside-XXXX)
    log="$OUT/beside-$name-$engine.log"
    uptime > "$log"
    case $engine in
      torchserve) ports="--inference-port 18400 --management-port 18401 --metrics-port 18402 --signals-port 18403 --grpc-inference-port 18404 --grpc-management-port 18405" ;;
      kserve) ports="--http-port 18400" ;;
      ray) ports="--http-port 18400 --signals-port 18403" ;;
    esac
    python -m serving --engine "$engine" --detach --model-store "$store" --run-dir "$run_dir" $ports >> "$log" 2>&1
    for round in 1 2; do
      /usr/bin/time -f "rollout command: %e s" python -m serving rollout "$name" "$store/$name.v2.mar" \
        --run-dir "$run_dir" --accept-weak-evidence >> "$log" 2>&1
      python -m serving rollback "$name" --run-dir "$run_dir" >> "$log" 2>&1
    done
    python -m serving stop --engine "$engine" --run-dir "$run_dir" >> "$log" 2>&1
    rm -rf "$run_dir"
  done
done
