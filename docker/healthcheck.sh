#!/usr/bin/env bash
# Healthy only when TorchServe's management API lists MODEL and, for every registered model, a READY worker whose
# process is alive (TorchServe keeps a killed worker READY until it notices). /ping answers as soon as the Java
# frontend is up, also while a worker is still loading its model or after it has died. Reads the address the server binds (TS_MANAGEMENT_ADDRESS, 0.0.0.0 meaning this machine).
set -euo pipefail

# With ENGINE=kserve: our readiness (serving/kserve/signals.py: every model has a live inference worker), then
# KServe's own for MODEL; a model is ready only once the archive's artifact passed its sha256 check and opened.
if [[ "${ENGINE:-torchserve}" == kserve ]]; then
  exec "${PYTHON:-python}" - "http://127.0.0.1:${KSERVE_HTTP_PORT:-8080}" "${MODEL:-resnet50}" \
    "${TS_KEYS_DIR:-${HOME:-/tmp}/.torchserve}/key_file.json" <<'KSERVE'
import json
import sys
import urllib.request
from pathlib import Path

base, model, key_file = sys.argv[1], sys.argv[2], Path(sys.argv[3])
headers = {}
if key_file.is_file():  # token authorisation is on: the model's readiness asks for the inference key
    headers["Authorization"] = "Bearer " + json.loads(key_file.read_text())["inference"]["key"]
for path in ("/health/ready", f"/v2/models/{model}/ready"):
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=5) as response:
            answer = json.load(response)
    except Exception as error:  # connection refused, 503 while loading, bad JSON: all unhealthy, said why
        sys.exit(f"unhealthy: {base}{path}: {error}")
    if answer.get("ready") is not True:
        sys.exit(f"unhealthy: {base}{path} answered {answer}")
print(f"healthy: KServe serves {model}")
KSERVE
fi

# With token authorisation on, the management key comes from the key_file.json the entrypoint's TorchServe
# writes in TS_KEYS_DIR.
exec "${PYTHON:-python}" - "${TS_MANAGEMENT_ADDRESS:-http://127.0.0.1:8081}" "${MODEL:-resnet50}" \
  "${TS_KEYS_DIR:-${HOME:-/tmp}/.torchserve}/key_file.json" <<'EOF'
import json
import os
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

address, model, key_file = urlsplit(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
host = "127.0.0.1" if address.hostname in (None, "0.0.0.0") else address.hostname
base = f"{address.scheme}://{host}:{address.port or 8081}"
headers = {}
if key_file.is_file():  # token authorisation is on
    headers["Authorization"] = "Bearer " + json.loads(key_file.read_text())["management"]["key"]


def alive(pid):
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def get(path):
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=5) as response:
            return json.load(response)
    except Exception as error:  # connection refused, 404, a refused key, bad JSON: all unhealthy, said why
        sys.exit(f"unhealthy: {base}{path}: {error}")


registered = [entry["modelName"] for entry in get("/models?limit=100")["models"]]  # one page: TorchServe lists at most 100
if model not in registered:
    sys.exit(f"unhealthy: {model} is not registered (models: {', '.join(registered) or 'none'})")
ready = {}
for name in registered:
    workers = [w for entry in get(f"/models/{name}") for w in entry.get("workers", [])]
    answering = [w for w in workers if w.get("status") == "READY" and alive(w.get("pid"))]
    if not answering:
        sys.exit(f"unhealthy: no READY worker alive for {name} (workers: "
                 f"{[(w.get('pid'), w.get('status')) for w in workers] or 'none'})")
    ready[name] = len(answering)
print("healthy: " + ", ".join(f"{name}: {count} READY worker(s) alive" for name, count in ready.items()))
EOF
