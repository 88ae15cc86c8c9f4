#!/usr/bin/env bash
# Serve every archive of the model store with TorchServe (ENGINE=torchserve, the default) or with KServe's own
# ModelServer (ENGINE=kserve): export the configured model first when the store has no MODEL.mar, then serve in
# the foreground until SIGTERM/SIGINT, which stops the server and its workers.
# Runs in the image (docker/Dockerfile) and natively from a checkout; every path and address comes from env.
set -euo pipefail

log() { printf 'entrypoint: %s\n' "$*" >&2; }
absolute() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
MODEL="${MODEL:-resnet50}"  # the archive that must be there: MODEL.mar, served at /predictions/MODEL
ARCH="${ARCH:-$MODEL}"      # the ResNet exported as MODEL when it is not (set it to name an export yourself)
WEIGHTS="${WEIGHTS:-auto}"
# More options for that export, split on spaces (e.g. "--formats scripted,onnx-scripted --precision fp32,int8").
read -r -a EXPORT_OPTIONS <<< "${EXPORT_ARGS:-}"
# Relative paths are taken from the caller's working directory, as `python -m export` does.
MODEL_STORE="$(absolute "${MODEL_STORE:-model-store}")"
ARTIFACTS="$(absolute "${ARTIFACTS:-artifacts/$MODEL}")"
TS_CONFIG="$(absolute "${TS_CONFIG:-$ROOT/serving/torchserve/config.properties}")"
ENGINE="${ENGINE:-torchserve}"
case "$ENGINE" in
  torchserve | kserve) ;;
  *) log "ENGINE=$ENGINE: choose torchserve or kserve"; exit 2 ;;
esac
# KServe's address: every interface of the container (its port is what an InferenceService routes to).
KSERVE_HOST="${KSERVE_HOST:-0.0.0.0}"
KSERVE_HTTP_PORT="${KSERVE_HTTP_PORT:-8080}"
STOP_TIMEOUT="${STOP_TIMEOUT:-25}"  # below compose's stop_grace_period (30 s), after which Docker kills
SIGNALS_PORT="${SIGNALS_PORT:-8083}"  # our metrics and health beside TorchServe (serving/signals.py); 0: none
PAGE_PORT="${PAGE_PORT:-8090}"  # the try-it page (serving/page/) on every interface of the container; 0: none
# Where the archive goes when MODEL_STORE is not writable (e.g. a bind mount Docker created as root).
KEYS_DIR="$(absolute "${TS_KEYS_DIR:-${HOME:-/tmp}/.torchserve}")"
FALLBACK_STORE="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/vision-export/model-store"

child=""          # process group of the running export or TorchServe (its leader's pid)
serving=false
page=""           # the try-it page beside TorchServe (its pid)

# The try-it page in front of TorchServe's inference API (KServe's `python -m serving` starts its own); never
# needed to serve: when it cannot start, it says why and TorchServe serves on.
start_page() {
  [[ "$PAGE_PORT" == 0 ]] && return
  local keys=()
  if [[ "${1:-}" == token ]]; then keys=(--key-file "$KEYS_DIR/key_file.json"); fi
  (cd "$ROOT" && exec "$PYTHON" -m serving.page --url "http://127.0.0.1:${TS_INFERENCE_ADDRESS##*:}" \
    --model-store "$MODEL_STORE" --page-host 0.0.0.0 --page-port "$PAGE_PORT" "${keys[@]}") &
  page=$!
}
# Our metrics (every worker's, from PROMETHEUS_MULTIPROC_DIR) and health beside TorchServe; never needed to serve.
signals=""
start_signals() {
  [[ "$SIGNALS_PORT" == 0 ]] && return
  local keys=() models
  if [[ "${1:-}" == token ]]; then keys=(--key-file "$KEYS_DIR/key_file.json"); fi
  models="$(sed -n 's/^load_models=//p' "$served_config" | tr ',' '\n' | cut -d= -f1 | tr '\n' ' ')"
  # shellcheck disable=SC2086  # one argument per model
  (cd "$ROOT" && exec "$PYTHON" -m serving.signals --host 0.0.0.0 --port "$SIGNALS_PORT" \
    --management "http://127.0.0.1:$(management_port)" --models $models "${keys[@]}") &
  signals=$!
}
management_port() { local address="${TS_MANAGEMENT_ADDRESS:-http://127.0.0.1:8081}"; echo "${address##*:}"; }
stop_signals() {
  if [[ -n "$signals" ]]; then kill -TERM "$signals" 2>/dev/null || true; wait "$signals" 2>/dev/null || true; signals=""; fi
}
stop_page() {
  if [[ -n "$page" ]]; then kill -TERM "$page" 2>/dev/null || true; wait "$page" 2>/dev/null || true; page=""; fi
}

# Stop a process group (its leader's pid in $1) and wait for every process in it; SIGKILL what is left
# after STOP_TIMEOUT. With "children-first", the leader's children get SIGTERM alone first: TorchServe's
# launcher only waits on Java and would die at once, while Java stops its workers itself (signalled
# directly, workers die and Java restarts them during its shutdown).
stop_group() {
  local deadline=$((SECONDS + STOP_TIMEOUT))
  if [[ "${2:-}" == children-first ]] && pkill -TERM -P "$1" 2>/dev/null; then
    while kill -0 "$1" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  fi
  kill -TERM -- "-$1" 2>/dev/null || true
  while kill -0 -- "-$1" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      log "still running after ${STOP_TIMEOUT}s; sending SIGKILL"
      kill -KILL -- "-$1" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  wait "$1" 2>/dev/null || true
}

on_signal() {
  trap '' TERM INT
  if [[ -n "$child" ]]; then
    if $serving && [[ "$ENGINE" == kserve ]]; then
      log "$1: stopping the KServe server"
      stop_group "$child"  # `python -m serving` stops the ModelServer and its workers on SIGTERM
    elif $serving; then
      log "$1: stopping TorchServe"
      stop_group "$child" children-first
    else
      log "$1: stopping the export"
      stop_group "$child"
    fi
  fi
  stop_page
  stop_signals
  # A stop while serving is the normal end; an interrupted export is not.
  if $serving; then exit 0; fi
  [[ "$1" == INT ]] && exit 130 || exit 143
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

# Run a command in its own process group (job control), so a stop reaches every process it started, and
# wait for it. `wait` returns early when a trapped signal arrives; on_signal then ends the script.
run() {
  set -m
  "$@" &
  child=$!
  set +m
  local status=0
  wait "$child" || status=$?
  # Anything the command left behind in its group (e.g. workers after a frontend crash) goes too.
  kill -0 -- "-$child" 2>/dev/null && stop_group "$child"
  child=""
  return "$status"
}

if [[ ! -f "$MODEL_STORE/$MODEL.mar" ]]; then
  mkdir -p "$MODEL_STORE" 2>/dev/null || true
  if [[ ! -w "$MODEL_STORE" ]]; then
    log "warning: $MODEL_STORE is not writable by uid $(id -u); using $FALLBACK_STORE instead." \
        "To keep the archive on the host, create the folder owned by uid $(id -u) or export there yourself."
    MODEL_STORE="$FALLBACK_STORE"
    mkdir -p "$MODEL_STORE"
  fi
fi
if [[ ! -f "$MODEL_STORE/$MODEL.mar" ]]; then
  log "no $MODEL.mar in $MODEL_STORE: exporting $ARCH (weights: $WEIGHTS) as $MODEL"
  # From the project root so `-m export` imports this checkout's code whatever the working directory.
  run bash -c 'cd "$1" && shift && exec "$@"' _ "$ROOT" \
    "$PYTHON" -m export resnet --arch "$ARCH" --name "$MODEL" --weights "$WEIGHTS" --model-store "$MODEL_STORE" \
    --out "$ARTIFACTS" "${EXPORT_OPTIONS[@]}"
fi

if [[ "$ENGINE" == kserve ]]; then
  runtime_dir="$(mktemp -d "${TMPDIR:-/tmp}/kserve.XXXXXX")"
  trap 'rm -rf "$runtime_dir"' EXIT
  log "serving every archive of $MODEL_STORE with KServe's ModelServer on $KSERVE_HOST:$KSERVE_HTTP_PORT" \
      "(no token authorisation: the mesh or ingress guards it, docs/scaling.md)"
  serving=true
  status=0
  run bash -c 'cd "$1" && shift && exec "$@"' _ "$ROOT" "$PYTHON" -m serving --engine kserve \
    --model-store "$MODEL_STORE" --host "$KSERVE_HOST" --inference-port "$KSERVE_HTTP_PORT" \
    --page-host 0.0.0.0 --page-port "$PAGE_PORT" \
    --run-dir "$runtime_dir" --follow-logs || status=$?  # the server's log lines on stdout: docker logs
  log "the KServe server exited with status $status"
  exit "$status"
fi

# TorchServe's launcher keeps its pid file, and Java its worker sockets and unpacked models, in the temp
# folder (/tmp/.model_server.pid, /tmp/.ts.sock.9000): a private one lets several servers share a machine.
runtime_dir="$(mktemp -d "${TMPDIR:-/tmp}/torchserve.XXXXXX")"
trap 'rm -rf "$runtime_dir"' EXIT

# Every archive of the store is registered (load_models in the written config), each with the serving policy
# of this machine (GPU or CPU), not of the one that exported it.
served_config="$runtime_dir/config.properties"
(cd "$ROOT" && "$PYTHON" -m serving config --config "$TS_CONFIG" --model-store "$MODEL_STORE" --out "$served_config") >&2

log "serving $(sed -n 's/^load_models=//p' "$served_config") from $MODEL_STORE with $served_config (from $TS_CONFIG)"
serving=true
status=0
# `-m ts.model_server` is the `torchserve` command run by $PYTHON, which is then also the workers' Python.
# TorchServe writes key_file.json (token authorisation, TS_DISABLE_TOKEN_AUTHORIZATION=false) in its working
# folder: a known one, so the health check and clients can read the keys.
mkdir -p "$KEYS_DIR"
metrics_dir="$runtime_dir/metrics"  # each worker's metric files (handlers/metrics.py), read by the signals server
mkdir -p "$metrics_dir"
export PROMETHEUS_MULTIPROC_DIR="$metrics_dir"
if [[ "${TS_DISABLE_TOKEN_AUTHORIZATION:-}" == [Ff][Aa][Ll][Ss][Ee] ]] \
   || grep -qx 'disable_token_authorization=false' "$served_config"; then
  log "token authorisation on: keys (inference, management) in $KEYS_DIR/key_file.json; anonymous requests are refused"
  start_page token
  start_signals token
else
  start_page
  start_signals
fi
run bash -c 'cd "$1" && shift && exec "$@"' _ "$KEYS_DIR" env TMPDIR="$runtime_dir" TEMP="$runtime_dir" \
  VISION_EXPORT_RUN_CONFIG="$served_config" PROMETHEUS_MULTIPROC_DIR="$metrics_dir" \
  "$PYTHON" -m ts.model_server --foreground --ncs --ts-config "$served_config" \
  --model-store "$MODEL_STORE" || status=$?
stop_page
stop_signals
log "TorchServe exited with status $status"
exit "$status"
