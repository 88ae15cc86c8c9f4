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
# The run dir `python -m serving rollout|rollback|versions` finds the server by: its pid file, run config (addresses,
# store, token switch), key file, logs, and the version a rollout left default (a restart serves it). `.serving` is
# --run-dir's default, so `docker exec CONTAINER python -m serving rollout ...` in the image's working folder
# (/home/app) needs no --run-dir. Two entrypoints on one machine need one each.
RUN_DIR="$(absolute "${RUN_DIR:-.serving}")"
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
pid_file=""       # where run() records that group for `python -m serving rollout` (TorchServe's run only)
serving=false
page=""           # the try-it page beside TorchServe (its pid)

# The try-it page in front of TorchServe's inference API (KServe's `python -m serving` starts its own); never
# needed to serve: when it cannot start, it says why and TorchServe serves on.
start_page() {
  [[ "$PAGE_PORT" == 0 ]] && return
  local keys=()
  if [[ "${1:-}" == token ]]; then keys=(--token-auth); fi  # each caller brings its own key
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
    --management "http://127.0.0.1:$(management_port)" --models $models "${keys[@]}" \
    --access-log "$LOG_LOCATION/access_log.log") &
  signals=$!
}
# What `python -m serving rollout` needs in the run dir to reach this TorchServe and read why a version would not
# load: the addresses it binds in fact (TS_*_ADDRESS override the config file; the last value of a key wins), the
# token switch, the key file and the logs (linked where they are elsewhere).
record_environment() {
  {
    printf '\n# Where this TorchServe listens (the environment overrides the lines above): read by `serving rollout`.\n'
    if [[ -n "${TS_INFERENCE_ADDRESS:-}" ]]; then printf 'inference_address=%s\n' "$TS_INFERENCE_ADDRESS"; fi
    if [[ -n "${TS_MANAGEMENT_ADDRESS:-}" ]]; then printf 'management_address=%s\n' "$TS_MANAGEMENT_ADDRESS"; fi
    if $tokens; then printf 'disable_token_authorization=false\n'; fi
  } >> "$served_config"
  rm -f "$RUN_DIR/key_file.json"
  rm -rf "$RUN_DIR/routes"  # a canary or capture a rollout of the last run left (handlers/routes.py)
  if $tokens; then ln -s "$KEYS_DIR/key_file.json" "$RUN_DIR/key_file.json"; fi
  export LOG_LOCATION="${LOG_LOCATION:-$RUN_DIR/logs}" METRICS_LOCATION="${METRICS_LOCATION:-$RUN_DIR/logs}"
  if [[ "$(absolute "$LOG_LOCATION")" != "$RUN_DIR/logs" ]] && [[ -L "$RUN_DIR/logs" || ! -e "$RUN_DIR/logs" ]]; then
    ln -sfn "$(absolute "$LOG_LOCATION")" "$RUN_DIR/logs"
  fi
}
# Token authorisation, the image's default (TS_DISABLE_TOKEN_AUTHORIZATION=false): one switch for both engines.
tokens_on() { [[ "${TS_DISABLE_TOKEN_AUTHORIZATION:-}" == [Ff][Aa][Ll][Ss][Ee] ]]; }
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
  if [[ -n "$pid_file" ]]; then printf '%s\n' "$child" > "$pid_file"; fi
  local status=0
  wait "$child" || status=$?
  # Anything the command left behind in its group (e.g. workers after a frontend crash) goes too.
  kill -0 -- "-$child" 2>/dev/null && stop_group "$child"
  if [[ -n "$pid_file" ]]; then rm -f "$pid_file"; fi
  child=""
  return "$status"
}

# A pid file of the run dir whose group still runs a server: another entrypoint or `python -m serving` serves from
# it (natively; a container starts with none running). Its command line is checked, not only its pid: after a
# container restart the run dir keeps the old pid file, and the number may belong to another process by now.
for engine_pid in "$RUN_DIR"/torchserve.pgid "$RUN_DIR"/kserve.pgid "$RUN_DIR"/ray.pgid; do
  [[ -f "$engine_pid" ]] || continue
  if pgrep -g "$(cat "$engine_pid")" -f 'ts[.]model_server|-m serving' >/dev/null 2>&1; then
    log "a server started from $RUN_DIR still runs (process group $(cat "$engine_pid")): stop it, or set RUN_DIR" \
        "to another folder"
    exit 2
  fi
  rm -f "$engine_pid"
done
mkdir -p "$RUN_DIR"

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
  log "serving every archive of $MODEL_STORE with KServe's ModelServer on $KSERVE_HOST:$KSERVE_HTTP_PORT"
  if tokens_on; then  # `python -m serving` reads the same switch; the keys are made once, kept in KEYS_DIR
    mkdir -p "$KEYS_DIR"
    if [[ ! -s "$KEYS_DIR/key_file.json" ]]; then
      (cd "$ROOT" && env -u VISION_EXPORT_KEY_FILE "$PYTHON" -c \
        'import sys, pathlib, serving.auth as a; a.write_keys(pathlib.Path(sys.argv[1]))' "$KEYS_DIR/key_file.json")
    fi
    export VISION_EXPORT_KEY_FILE="$KEYS_DIR/key_file.json"
    log "token authorisation on: keys (inference, management) in $KEYS_DIR/key_file.json; anonymous requests are refused"
  fi
  serving=true
  status=0
  run bash -c 'cd "$1" && shift && exec "$@"' _ "$ROOT" "$PYTHON" -m serving --engine kserve \
    --model-store "$MODEL_STORE" --host "$KSERVE_HOST" --inference-port "$KSERVE_HTTP_PORT" \
    --page-host 0.0.0.0 --page-port "$PAGE_PORT" \
    --run-dir "$RUN_DIR" --follow-logs || status=$?  # the server's log lines on stdout: docker logs
  log "the KServe server exited with status $status"
  exit "$status"
fi

# TorchServe's launcher keeps its pid file, and Java its worker sockets and unpacked models, in the temp
# folder (/tmp/.model_server.pid, /tmp/.ts.sock.9000): a private one lets several servers share a machine.
runtime_dir="$(mktemp -d "${TMPDIR:-/tmp}/torchserve.XXXXXX")"
trap 'rm -rf "$runtime_dir"' EXIT

# Every archive of the store is registered (load_models in the written config), each with the serving policy
# of this machine (GPU or CPU), not of the one that exported it.
# In the run dir: `rollout` reads it; with --run-dir, the version a rollout left default is the one served.
served_config="$RUN_DIR/config.properties"
(cd "$ROOT" && "$PYTHON" -m serving config --config "$TS_CONFIG" --model-store "$MODEL_STORE" --run-dir "$RUN_DIR" \
  --out "$served_config") >&2
tokens=false
if tokens_on || grep -qx 'disable_token_authorization=false' "$served_config"; then
  tokens=true
fi
record_environment

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
if $tokens; then
  log "token authorisation on: keys (inference, management) in $KEYS_DIR/key_file.json; anonymous requests are refused"
  start_page token
  start_signals token
else
  start_page
  start_signals
fi
pid_file="$RUN_DIR/torchserve.pgid"
run bash -c 'cd "$1" && shift && exec "$@"' _ "$KEYS_DIR" env TMPDIR="$runtime_dir" TEMP="$runtime_dir" \
  VISION_EXPORT_RUN_CONFIG="$served_config" PROMETHEUS_MULTIPROC_DIR="$metrics_dir" \
  "$PYTHON" -m ts.model_server --foreground --ncs --ts-config "$served_config" \
  --model-store "$MODEL_STORE" || status=$?
stop_page
stop_signals
log "TorchServe exited with status $status"
exit "$status"
