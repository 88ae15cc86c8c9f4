"""The same photos through a running endpoint, CONCURRENCY requests in flight: photos per second, and every answer
a 200 (`python -m serving --detach` started it; run.sh). LIMIT: only the first LIMIT photos (finding the best
concurrency).

    python docs/results/2026-11-27-batch/endpoint.py URL PHOTOS_DIR CONCURRENCY [LIMIT]
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

url, folder, concurrency = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
photos = sorted(folder.iterdir())[: int(sys.argv[4]) if len(sys.argv) > 4 else None]
session = requests.Session()
session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=concurrency))


def post(path: Path) -> int:
    return session.post(url, data=path.read_bytes(), headers={"Content-Type": "image/jpeg"}, timeout=600).status_code


started = time.monotonic()
with ThreadPoolExecutor(concurrency) as pool:
    statuses = list(pool.map(post, photos))
seconds = time.monotonic() - started
print(
    json.dumps(
        {
            "concurrency": concurrency,
            "photos": len(photos),
            "ok": statuses.count(200),
            "seconds": round(seconds, 2),
            "photos_per_s": round(len(photos) / seconds, 2),
        }
    )
)
