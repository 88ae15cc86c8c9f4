#!/usr/bin/env bash
# A version loaded beside the live one, without client load, on every engine: the code before (BEFORE, a git
# worktree of 54d65a6 with the same .venv) and after (this checkout), one engine at a time, each with a server of
# its own and three rollouts and rollbacks, each printing "vN loaded beside vM and answering (S s)":
#   STORE=DIR OUT=DIR BEFORE=WORKTREE [ENGINES="kserve"] [PAUSE=10] docs/results/2026-11-29-beside-and-switch/beside.sh
# PAUSE: seconds between commands (a KServe pool renews its spare only once it has all its workers).
# STORE holds efficientnet-lite0.mar and .v1.mar (v1) and efficientnet-lite0.v2.mar (the same export archived again).
set -uo pipefail
mkdir -p "$OUT"
AFTER=$(cd "$(dirname "$0")/../../.." && pwd)
name=efficientnet-lite0
grep -o 'avx512[a-z_]*\|avx2\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu.txt"
for engine in ${ENGINES:-torchserve kserve ray}; do
  for code in before after; do
    tree=$([ "$code" = before ] && echo "$BEFORE" || echo "$AFTER")
    run_dir=$(mktemp -d /tmp/beside-XXXX)
    log="$OUT/beside-$engine-$code${PAUSE:+-pause$PAUSE}.log"
    uptime > "$log"
    case $engine in
      torchserve) ports="--inference-port 18400 --management-port 18401 --metrics-port 18402 --signals-port 18403 --grpc-inference-port 18404 --grpc-management-port 18405" ;;
      kserve) ports="--http-port 18400" ;;
      ray) ports="--http-port 18400 --signals-port 18403" ;;
    esac
    cd "$tree"
    .venv/bin/python -m serving --engine "$engine" --detach --model-store "$STORE" --run-dir "$run_dir" $ports >> "$log" 2>&1
    for round in 1 2 3; do
      /usr/bin/time -f "rollout command: %e s" .venv/bin/python -m serving rollout "$name" "$STORE/$name.v2.mar" \
        --run-dir "$run_dir" --accept-weak-evidence >> "$log" 2>&1
      sleep "${PAUSE:-0}"
      /usr/bin/time -f "rollback command: %e s" .venv/bin/python -m serving rollback "$name" --run-dir "$run_dir" >> "$log" 2>&1
      sleep "${PAUSE:-0}"
    done
    .venv/bin/python -m serving stop --engine "$engine" --run-dir "$run_dir" >> "$log" 2>&1
    uptime >> "$log"
    rm -rf "$run_dir"
  done
done
