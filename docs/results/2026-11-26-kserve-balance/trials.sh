#!/usr/bin/env bash
# How each KServe worker shares the load of a client with few keep-alive connections, over many short trials.
#
#   bash trials.sh CHECKOUT MODEL_STORE OUT_DIR [TRIALS] [CONCURRENCY...]
#
# Starts `python -m serving --engine kserve` from CHECKOUT (its own code; the machine's policy: on 2 cores, 2
# workers of 1 thread) on MODEL_STORE (one archive), then for each concurrency TRIALS runs of
# `hey -z 5s -c C` with KServe's v1 JSON of examples/cat.jpg, each on connections of its own, and after each
# run counts the rows each worker process answered (the "batch of N" lines the request core logs with its
# pid) in the server's log. Prints, and appends to OUT_DIR/trials.log, one line per run:
#   LABEL c=C trial T: R req/s, worker shares P1 P2 (the busier first)
# The server is stopped at the end (python -m serving stop).
set -eu
checkout="$(cd "$1" && pwd)"; store="$(cd "$2" && pwd)"; out="$3"; trials="${4:-10}"; shift 4 || shift $#
concurrencies="${*:-2 4 8}"
python="${PYTHON:-/work/main/.venv/bin/python}"
label="$(basename "$checkout")"
run_dir="$(mktemp -d)"; mkdir -p "$out"
model="$(basename "$(ls "$store"/*.mar | head -1)" .mar)"
port=$((20000 + RANDOM % 20000))
body="$run_dir/cat.v1.json"
"$python" -c "import base64,json,sys; print(json.dumps({'instances':[{'image':{'b64':base64.b64encode(open(sys.argv[1],'rb').read()).decode()}}]}))" \
  "$checkout/examples/cat.jpg" > "$body"
cd "$checkout"
PYTHONPATH="$checkout" "$python" -m serving --engine kserve --model-store "$store" --run-dir "$run_dir/run" \
  --inference-port "$port" --detach > "$run_dir/start.log" 2>&1 || { cat "$run_dir/start.log"; exit 1; }
log="$(ls "$run_dir"/run/logs/kserve.log 2>/dev/null || ls "$run_dir"/run/kserve.log)"
url="http://127.0.0.1:$port/v1/models/$model:predict"
hey -z 5s -c 8 -m POST -T application/json -D "$body" "$url" > /dev/null  # warm-up
for c in $concurrencies; do
  for t in $(seq 1 "$trials"); do
    offset=$(wc -c < "$log")
    rate=$(hey -z 5s -c "$c" -m POST -T application/json -D "$body" "$url" | awk '/Requests\/sec/ {print $2}')
    sleep 0.5
    shares=$(tail -c +"$((offset + 1))" "$log" | awk '/ batch of / {split($0, a, " batch of "); split(a[2], b, ":"); n[$3] += b[1]; total += b[1]}
      END {s = ""; for (p in n) s = s sprintf("%d ", 100 * n[p] / total); print s}' | tr ' ' '\n' | sort -rn | tr '\n' ' ')
    echo "$label c=$c trial $t: $rate req/s, worker shares % ${shares}" | tee -a "$out/trials.log"
  done
done
PYTHONPATH="$checkout" "$python" -m serving stop --run-dir "$run_dir/run" > /dev/null 2>&1 || true
