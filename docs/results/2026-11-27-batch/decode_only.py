"""The batch run's decoding alone: the same photos through the same Ray Data decode tasks as `python -m serving
batch` (serving/batch/decoding.py, spread as serving/batch/run.py spreads them: at most one task per CPU), with no
model after them. Prints one JSON line: photos, seconds, photos/s (and after the first decoded photos, once the task
processes are up), task processes, the decode and preprocess ms per
photo as the tasks timed them. LIMIT: the first LIMIT photos only (photos.py writes the sizes in turn, so any
first hundreds hold the same mix).

    python docs/results/2026-11-27-batch/decode_only.py EXPORT PHOTOS_DIR [LIMIT]
"""

import json
import sys
import time
from pathlib import Path

import ray.data

from serving.batch.decoding import decode_batch
from serving.batch.inputs import read_inputs
from serving.batch.run import ROWS_PER_CALL, decoding, start_ray

export, photos = Path(sys.argv[1]), read_inputs(sys.argv[2])[: int(sys.argv[3]) if len(sys.argv) > 3 else None]
started = time.monotonic()
start_ray(None)
try:
    items = [{"input": p.input, "shard": "", "path": p.path or "", "data": b""} for p in photos]
    rows = ray.data.from_items(items, override_num_blocks=max(1, -(-len(items) // ROWS_PER_CALL)))
    decoded = rows.map_batches(decode_batch, batch_size=ROWS_PER_CALL, batch_format="numpy", **decoding(export))
    cpus = int(ray.cluster_resources().get("CPU", 0))
    scoring = time.monotonic()
    count, decoders, stage_ms = 0, set(), {"decode": 0.0, "preprocess": 0.0}
    for batch in decoded.drop_columns(["prepared"]).iter_batches(batch_size=None, batch_format="pyarrow"):
        if not count:  # the task processes started (Python, torch): the rate after it is decoding's own
            first_at, first_rows = time.monotonic(), batch.num_rows
        count += batch.num_rows
        decoders.update(batch.column("decoder").to_pylist())
        for stage in stage_ms:
            stage_ms[stage] += sum(batch.column(f"{stage}_ms").to_pylist())
    ended = time.monotonic()
    seconds = ended - scoring
finally:
    ray.shutdown()
print(
    json.dumps(
        {
            "photos": count,
            "ray_start_s": round(scoring - started, 2),
            "seconds": round(seconds, 2),
            "photos_per_s": round(count / seconds, 2),
            "photos_per_s_after_first": round((count - first_rows) / (ended - first_at), 2)
            if count > first_rows
            else None,
            "task_processes": len(decoders),
            "ray_cpus": cpus,
            "stage_ms_per_photo": {stage: round(ms / max(1, count), 2) for stage, ms in stage_ms.items()},
        }
    )
)
