"""run.sh's figures side by side: the batch run, its decoding alone, the in-process ceiling of the same stages for
the same mix of sizes, and the endpoint at its best concurrency; read from WORK/results.

    python docs/results/2026-11-27-batch/report.py WORK
"""

import json
import sys
from pathlib import Path

work = Path(sys.argv[1])
results = work / "results"


def last_json(path: Path) -> dict:
    return json.loads(path.read_text().strip().splitlines()[-1])


batch = last_json(results / "batch.txt")
decode = last_json(results / "decode.json")
pipeline = json.loads((work / "pipeline" / "pipeline.json").read_text())
mix = json.loads((work / "mix.json").read_text())
probes = [json.loads(line) for line in (results / "endpoint-probe.jsonl").read_text().splitlines()]
endpoint = last_json(results / "endpoint.json")

# the ceiling of the mix: the policy's workers, each at the pipeline's ms per photo of each size, weighted by its share
ms_per_photo = sum(mix[row["body"]] * row["pipeline_ms_per_image"] for row in pipeline["rows"] if row["body"] in mix)
workers = pipeline["context"]["workers"]
ceiling = workers * 1000 / ms_per_photo
rate = batch["photos_per_s"]
steady = batch["photos_per_s_after_first_answers"]
lines = [
    f"photos: {batch['photos']} ({', '.join(f'{k} {v:.0%}' for k, v in mix.items())}), "
    f"model {pipeline['context']['model']} ({pipeline['context']['artifact']}), {workers} worker(s)",
    f"batch:    {rate:.2f} photos/s over the run ({batch['scoring_s']:.0f} s after a start of "
    f"{batch['start_s']:.0f} s), {steady:.2f} after the first answers; {batch['failed']} error rows",
    f"ceiling:  {ceiling:.2f} photos/s (measure pipeline: {workers} x one worker's rate, {ms_per_photo:.0f} ms "
    f"per photo of the mix); batch / ceiling {rate / ceiling:.2f} ({steady / ceiling:.2f} after the first answers)",
    f"endpoint: {endpoint['photos_per_s']:.2f} photos/s at concurrency {endpoint['concurrency']} (best of "
    + ", ".join(f"{p['concurrency']}: {p['photos_per_s']:.2f}" for p in probes)
    + f" on the first {probes[0]['photos']}); {endpoint['ok']}/{endpoint['photos']} answered 200; "
    f"batch / endpoint {rate / endpoint['photos_per_s']:.2f}",
    f"decoding: alone {decode['photos_per_s']:.2f} photos/s ({decode['photos_per_s_after_first']} once its "
    f"processes were up) in {decode['task_processes']} task process(es) on "
    f"{decode['ray_cpus']} CPU(s) ({decode['stage_ms_per_photo']}); in the batch run "
    f"{batch['decoding']['tasks']} task process(es), {batch['decoding']['cpus']:.2f} CPU(s) busy on average",
]
if (results / "batch-ray.txt").is_file():  # run.sh with BATCH_ALSO_RAY=1
    ray = last_json(results / "batch-ray.txt")
    lines.insert(
        2,
        f"batch through Ray Data (--address local): {ray['photos_per_s']:.2f} photos/s over the run, "
        f"{ray['photos_per_s_after_first_answers']:.2f} after the first answers; / ceiling "
        f"{ray['photos_per_s'] / ceiling:.2f}",
    )
print("\n".join(lines))
