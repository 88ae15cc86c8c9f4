"""Throughput and latency of the served model under load, per serving configuration, against an honest
baseline and the in-process ceiling measured in the same run.

  python -m serving bench [--export-dir artifacts/resnet50] [--duration 20] [--concurrency 1,4,8,16]
                          [--configurations naive,default,...] [--inprocess run|none|bench.json]

1. In-process (unless --inprocess none or a bench.json is given): `python -m export bench` on the same
   export, at the serving thread count and all cores, with this machine's GEMM peak (bench.md/json/png).
2. For each configuration (bench_configurations.py) it builds an archive from the export folder, named after
   the model, starts a real TorchServe on free loopback ports and drives it with `hey` (serving/measure/
   loadgen.py) for a fixed duration at each concurrency (or a fixed count with --requests). `naive` is the
   baseline: the traced TorchScript behind a handler written as TorchServe's documentation teaches
   (naive_handler.py), TorchServe's default worker count, no thread tuning, no batching.
3. Where the time goes: our handler logs decode/preprocess/inference/encode per batch (model_log.log, the
   same numbers as its Prometheus metrics); the medians per request of each row sit beside its throughput.
Prints a table and writes results.md (with ratios to the naive row at the same concurrency and to the best
in-process throughput at the largest measured batch <= the concurrency), results.json, targets.json and
throughput.png (bench_report.py). Numbers from one run on a shared machine: compare rows of the same run only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from export import bench as inprocess
from export.archive import build_archive
from export.atomic import atomic_write_text
from handlers.policy import machine_policy, this_machine
from models.contract import MANIFEST_NAME, Manifest
from models.errors import VisionExportError
from serving.torchserve import server
from serving.torchserve.config import EXAMPLE_IMAGE, ServerSettings, on_free_ports
from serving.deploy.common import DEFAULT_EXPORT_DIR
from serving.measure import bench_report as report
from serving.measure.bench_configurations import (CONFIGURATIONS, CORES, NAIVE, NAIVE_CONFIG, build_naive_archive,
                                                  naive_policy, runnable, served_kind, ungated_verdict)
from serving.measure.command import run_load_command
from serving.measure.loadgen import require_hey, run_hey

DEFAULT_DURATION_S = 20
DEFAULT_LEVELS = "1,4,8,16"
WARMUP_REQUESTS_PER_CLIENT = 2
LOG_FLUSH_S = 1.0  # the frontend copies worker stdout into model_log.log asynchronously


class BenchError(VisionExportError):
    """The benchmark cannot run as asked; the message says which option and what to give."""


# ------------------------------------------------------------------ one configuration, served and loaded
def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def read_from(path: Path, offset: int) -> str:
    if not path.exists():  # no batch was logged (the naive handler logs none)
        return ""
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


def prepare_server(name: str, export_dir: Path, manifest: Manifest, scratch: Path,
                   token_auth: bool) -> ServerSettings:
    configuration = CONFIGURATIONS[name]
    store = scratch / name / "store"
    settings = on_free_ports(store, scratch / name / "run")
    settings.model_name = manifest.model.name
    settings.token_auth = token_auth
    settings.extra_env = dict(configuration.env)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    if name == NAIVE:
        build_naive_archive(export_dir, manifest, store)
        config = scratch / name / "config.properties"
        config.write_text(NAIVE_CONFIG)
        settings.config, settings.policy = config, naive_policy()
    else:
        build_archive(export_dir, manifest, store, None, configuration.artifact, configuration.overrides,
                      configuration.speed_only_ungated)
    return settings


def bench_configuration(name: str, export_dir: Path, manifest: Manifest, image: Path, levels: list[int],
                        scratch: Path, duration_s: int | None, requests: int | None,
                        token_auth: bool = False) -> list[dict]:
    settings = prepare_server(name, export_dir, manifest, scratch, token_auth)
    gate = ungated_verdict(name, manifest)
    precision = manifest.artifacts[served_kind(name, manifest)].precision
    model_log = settings.log_dir / "model_log.log"
    rows = []
    with server.running(settings, image):
        headers = server.auth_headers(settings)
        timeout = settings.response_timeout_s  # a request may take as long as TorchServe lets a worker take
        run_hey(settings.predictions_url(), image, max(levels), timeout,
                requests=WARMUP_REQUESTS_PER_CLIENT * max(levels), headers=headers)
        for level in levels:
            time.sleep(LOG_FLUSH_S)
            offset = log_size(model_log)
            load = run_hey(settings.predictions_url(), image, level, timeout, duration_s, requests, headers)
            time.sleep(LOG_FLUSH_S)
            stages = report.stage_medians(report.parse_stage_lines(read_from(model_log, offset)))
            row = {"configuration": name, "model": manifest.model.name, "precision": precision,
                   "concurrency": level, "duration_s": duration_s, "requests": load.requests,
                   "req_per_s": load.req_per_s, "p50_ms": load.p50_ms, "p90_ms": load.p90_ms, "p99_ms": load.p99_ms,
                   "failed": load.failed, "stages_ms": stages, **({"gate": gate} if gate else {})}
            print(report.progress_line(name, row), flush=True)
            rows.append(row)
    return rows


# ------------------------------------------------------------------ in-process reference
def inprocess_report(source: str, export_dir: Path, out: Path) -> inprocess.Report | None:
    if source == "none":
        return None
    if source != "run":
        return inprocess.load_report(Path(source))
    policy = machine_policy(*this_machine())
    plan = inprocess.Plan(list(inprocess.DEFAULT_BATCHES),
                          inprocess.parse_threads(f"{policy.threads_per_worker},all", CORES))
    print(f"in-process benchmark of {export_dir} (threads {plan.threads}: the serving policy's and all cores)",
          flush=True)
    result = inprocess.run([export_dir], plan, say=lambda line: print(line, flush=True))
    inprocess.write_outputs(result, out)
    return result


def best_fp32_peak_fraction(result: inprocess.Report | None) -> float | None:
    fractions = [r.peak_fraction for r in (result.rows if result else [])
                 if r.device == "cpu" and r.precision == "fp32" and r.peak_fraction is not None]
    return max(fractions) if fractions else None


# ------------------------------------------------------------------ entry point
def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m serving bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export-dir", type=Path, default=DEFAULT_EXPORT_DIR)
    parser.add_argument("--image", type=Path, default=EXAMPLE_IMAGE)
    parser.add_argument("--duration", type=int, default=DEFAULT_DURATION_S, help="seconds per row (default 20)")
    parser.add_argument("--requests", type=int, default=None, help="a fixed count per row instead of --duration")
    parser.add_argument("--concurrency", default=DEFAULT_LEVELS)
    parser.add_argument("--configurations", default=",".join(CONFIGURATIONS))
    parser.add_argument("--inprocess", default="run",
                        help="run (default: the in-process benchmark first, same export), none, or a bench.json")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--token-auth", action="store_true", help="serve with token authorisation on")
    return parser.parse_args(argv)


def check(args) -> tuple[list[int], list[str]]:
    if not (args.export_dir / MANIFEST_NAME).is_file():
        raise BenchError(f"{args.export_dir} has no {MANIFEST_NAME}: run `python -m export ...` first, "
                         "or pass --export-dir")
    try:
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        raise BenchError(f"--concurrency {args.concurrency!r}: give integers separated by commas, e.g. 1,4,8,16") from None
    names = [n for n in args.configurations.split(",") if n]
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        raise BenchError(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(CONFIGURATIONS)}")
    if not levels or min(levels) < 1 or args.duration < 1 or (args.requests is not None and args.requests < 1):
        raise BenchError("--concurrency, --duration and --requests must be at least 1")
    require_hey()  # after the options, so a typo is reported on machines without hey too
    return levels, names


def _main(argv) -> int:
    args = parse_args(argv)
    levels, names = check(args)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = Manifest.read(args.export_dir)
    names = runnable(names, manifest)
    measured = inprocess_report(args.inprocess, args.export_dir, args.out)
    best = {precision: {b: r.images_per_s for b, r in inprocess.best_rows(measured.rows, precision=precision).items()}
            for precision in ("fp32", "int8")} if measured else {}
    for name in names:
        print(f"{name}: {CONFIGURATIONS[name].description}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        for name in names:
            rows += bench_configuration(name, args.export_dir, manifest, args.image, levels, Path(scratch),
                                        None if args.requests else args.duration, args.requests, args.token_auth)
    report.add_ratios(rows, best)
    targets = report.evaluate_targets(rows, best.get("fp32", {}), best_fp32_peak_fraction(measured))
    per_row = f"{args.requests} requests" if args.requests else f"{args.duration} s"
    header = (f"# Serving benchmark: {manifest.model.name} ({manifest.weights.get('kind', 'unrecorded')} weights), "
              f"{CORES} cores, {per_row} per row, hey")
    atomic_write_text(args.out / "results.md", report.render_markdown(rows, targets, names, header))
    atomic_write_text(args.out / "results.json", json.dumps(rows, indent=2))
    atomic_write_text(args.out / "targets.json", json.dumps([asdict(t) for t in targets], indent=2))
    report.chart(rows, best.get("fp32", {}), args.out / "throughput.png")
    print("\n" + report.table(rows) + "\n\n" + report.targets_table(targets)
          + f"\n\nwrote {args.out}/results.md, results.json, targets.json, throughput.png")
    return 0


def main(argv=None) -> int:
    return run_load_command(lambda: _main(argv))


if __name__ == "__main__":
    sys.exit(main())
