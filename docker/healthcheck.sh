#!/usr/bin/env bash
# Healthy only when TorchServe's management API lists a READY worker for the model. /ping answers as soon
# as the Java frontend is up, also while the worker is still loading the model or after it has died.
# Reads the address the server binds (TS_MANAGEMENT_ADDRESS, 0.0.0.0 meaning this machine).
set -euo pipefail

# With token authorisation on, the management key comes from the key_file.json the entrypoint's TorchServe
# writes in TS_KEYS_DIR.
exec "${PYTHON:-python}" - "${TS_MANAGEMENT_ADDRESS:-http://127.0.0.1:8081}" "${MODEL_NAME:-resnet}" \
  "${TS_KEYS_DIR:-${HOME:-/tmp}/.torchserve}/key_file.json" <<'EOF'
import json
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

address, model, key_file = urlsplit(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
host = "127.0.0.1" if address.hostname in (None, "0.0.0.0") else address.hostname
url = f"{address.scheme}://{host}:{address.port or 8081}/models/{model}"
headers = {}
if key_file.is_file():  # token authorisation is on
    headers["Authorization"] = "Bearer " + json.loads(key_file.read_text())["management"]["key"]
try:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as response:
        workers = [w for entry in json.load(response) for w in entry.get("workers", [])]
except Exception as error:  # connection refused, 404 (model not registered), bad JSON: all unhealthy
    sys.exit(f"unhealthy: {url}: {error}")
statuses = [w.get("status") for w in workers]
if "READY" not in statuses:
    sys.exit(f"unhealthy: no READY worker for {model} (workers: {statuses or 'none'})")
print(f"healthy: {statuses.count('READY')} READY worker(s) for {model}")
EOF
