"""`python -m measure pipeline`: the request path's ceiling, measured in one process.

    python -m examples.photo_sizes bodies/
    python -m measure pipeline --export-dir artifacts/resnet50 --images bodies/

For each body (an image file, or every image of a folder), it times the code each TorchServe worker runs,
handlers.core's decode -> preprocess -> inference -> encode (`run_batch` of the export's task's core: a
classifier's crop and top-k, a detector's whole-image resize and boxes, handlers/tasks.py), at one
worker's thread budget under this machine's serving policy, and beside it the model alone on the same
already-preprocessed rows. A served rate can be no better than the pipeline's, so every served figure of the
same body has its ceiling here; where the pipeline row is far below the model-only one, the request path, not
the model, is what to make faster. `workers x per worker` is an upper bound (the workers' threads never
exceed the cores, but they share memory bandwidth). Writes pipeline.md and pipeline.json.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from contract.records import Manifest
from handlers.core import STAGES, ImageCore, ImageRequest
from handlers.policy import machine_policy, this_machine_resources
from handlers.request_error import RequestError
from handlers.tasks import CORES
from measure.command import MeasureError, write_tables
from runtime.images import shown_size
from runtime.timing import time_runs

# --decode: the handler settings of each row's core
DECODE_CHOICES = {"manifest": ({},), "exact": ({"decode": "exact"},), "both": ({"decode": "exact"}, {})}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")
WARMUP_RUNS = 2
MIN_RUNS = 3


def bodies(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise MeasureError(f"{path}: no image file there; pass a JPEG/PNG or a folder of them "
                           "(python -m examples.photo_sizes DIR writes one)")
    return files


def measure_body(core: ImageCore, path: Path, batch: int, seconds: float) -> dict:
    data = path.read_bytes()
    requests = [ImageRequest(data)] * batch
    stage_ms = {stage: [] for stage in STAGES}

    def pipeline():
        result = core.run_batch(requests)
        failed = [a for a in result.answers if isinstance(a, RequestError)]
        if failed:
            raise MeasureError(f"{path.name} is refused by the handler ({failed[0].code}: {failed[0].message})")
        for stage in STAGES:
            stage_ms[stage].append(result.times.ms[stage] / batch)

    total = time_runs(pipeline, WARMUP_RUNS, MIN_RUNS, seconds)
    rows = core.batch([core.preprocess(core.decode(data))] * batch)
    model = time_runs(lambda: core.predict(rows), WARMUP_RUNS, MIN_RUNS, seconds)
    per_image, model_per_image = statistics.median(total) / batch, statistics.median(model) / batch
    return {"body": path.name, "bytes": len(data), "shown": list(shown_size(data)), "decode": core.decode_mode(),
            "batch": batch, "runs": len(total),
            "stage_ms": {s: round(statistics.median(v[WARMUP_RUNS:]), 2) for s, v in stage_ms.items()},
            "pipeline_ms_per_image": round(per_image, 2), "model_ms_per_image": round(model_per_image, 2),
            "pipeline_images_per_s": round(1000 / per_image, 1), "model_images_per_s": round(1000 / model_per_image, 1),
            "pipeline_vs_model": round(model_per_image / per_image, 2)}


def markdown(rows: list[dict], context: dict) -> str:
    lines = [f"# Request-path ceiling: {context['model']} ({context['artifact']})", "",
             f"One worker's budget: {context['threads']} thread(s), batch {context['batch']}; the policy runs "
             f"{context['workers']} worker(s) on {context['cores']} core(s). Medians per image.", "",
             "| body | shown | MB | decode mode | decode ms | preprocess ms | inference ms | encode ms "
             "| pipeline images/s (x workers) | model alone images/s | pipeline / model |", "|" + "---|" * 11]
    for r in rows:
        ms = r["stage_ms"]
        lines.append(f"| {r['body']} | {r['shown'][0]}x{r['shown'][1]} | {r['bytes'] / 1e6:.2f} | {r['decode']} "
                     f"| {ms['decode']:.1f} "
                     f"| {ms['preprocess']:.1f} | {ms['inference']:.1f} | {ms['encode']:.2f} "
                     f"| {r['pipeline_images_per_s']:.1f} ({r['pipeline_images_per_s'] * context['workers']:.1f}) "
                     f"| {r['model_images_per_s']:.1f} | {r['pipeline_vs_model']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from contract.cli import run_command  # our errors become one line and an exit code
    return run_command(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m measure pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export-dir", type=Path, default=Path("artifacts/resnet50"))
    parser.add_argument("--images", type=Path, default=Path("examples/cat.jpg"), help="an image, or a folder of them")
    parser.add_argument("--batch", type=int, default=None, help="rows per run (default: the policy's batch size)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per row (default: %(default)s)")
    parser.add_argument("--decode", choices=DECODE_CHOICES, default="both",
                        help="manifest: decode as the export decided (draft where its decode check passed); exact: "
                             "every pixel (the handler's `decode: exact`); both: a row of each per body, before and "
                             "after in one run (default: %(default)s)")
    parser.add_argument("--artifact", default=None, metavar="KIND",
                        help="the export's form to run (default: the one this machine serves, chosen as the handler "
                             "chooses at startup without measuring)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/pipeline"))
    args = parser.parse_args(argv)
    gpus, cores = this_machine_resources()
    policy = machine_policy(gpus, cores)
    device = "cuda" if gpus else "cpu"
    manifest = Manifest.read(args.export_dir)
    if args.artifact and args.artifact not in manifest.artifacts:
        raise MeasureError(f"--artifact {args.artifact}: this export has {', '.join(manifest.artifacts)}")
    task_core = CORES[manifest.task]  # a detector's request path is its own
    cores_by_mode = [task_core.from_folder(args.export_dir, device=device, threads=policy.threads_per_worker,
                                           settings=settings, kind=args.artifact)
                     for settings in DECODE_CHOICES[args.decode]]
    cores_by_mode = list({each.decode_mode(): each for each in cores_by_mode}.values())  # the export's may be exact
    core = cores_by_mode[-1]
    batch = args.batch or policy.batch_size
    files = bodies(args.images)
    rows = [measure_body(each, path, batch, args.seconds) for path in files for each in cores_by_mode]
    context = {"model": core.manifest.model.name, "artifact": core.record.kind, "threads": core.threads,
               "batch": batch, "workers": policy.workers, "cores": cores, "export_dir": str(args.export_dir)}
    report = markdown(rows, context)
    write_tables(args.out, "pipeline", report, context, rows)
    return 0
