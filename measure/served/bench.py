"""Throughput and latency of the served model under load, per serving configuration and per image body,
against an honest baseline, a peer, and the ceilings measured in the same run.

  python -m measure bench [--export-dir artifacts/resnet50] [--images examples/cat.jpg,bodies/] [--duration 20]
                          [--concurrency 1,4,8,16] [--configurations naive,default,...,litserve]
                          [--inprocess run|none|bench.json] [--pipeline run|none] [--pipeline-seconds 3]

1. Model alone (unless --inprocess none or a bench.json is given): `python -m measure inprocess` on the same
   export, at the serving thread count and all cores, with this machine's GEMM peak (bench.md/json/png).
2. Pipeline ceiling (unless --pipeline none): `python -m measure pipeline`'s request path per body for each
   artifact a configuration serves, at one worker's thread budget x the policy's workers (pipeline.md/json,
   ceiling.py).
3. Served: for each configuration (configurations.py) a real server on free loopback ports, driven by
   `hey` (measure/loadgen.py) for a fixed duration (or a fixed count with --requests) at each concurrency, one row per
   body (--images: files and folders, comma-separated; each sent with its own Content-Type) and, with several
   bodies, a `mix` row that sends them all at once (rows.py says how). `naive` is the baseline: the
   traced TorchScript behind a handler written as TorchServe's documentation teaches (naive_handler.py),
   TorchServe's default worker count, no thread tuning, no batching. `litserve` is the peer: the same artifact
   and preprocessing behind a minimal LitServe server (peer_litserve.py, peer.py). `kserve` is the second
   engine: the same archive and core in KServe's own ModelServer (serving/kserve/), sent v1 JSON; `ray` the
   distributed one: the same archive and core as a Ray Serve deployment behind Serve's proxy (serving/ray/;
   skipped, saying so, where Ray is not installed and --configurations was not given).
4. Where the time goes: our handler logs decode/preprocess/inference/encode per batch (model_log.log, the
   same numbers as its Prometheus metrics); the medians per request of each row sit beside its throughput.
5. How each row compares: the served choice (`default`) against its artifact alone, its request path, the naive
   baseline, the peer, the fp32 ONNX served, its own median latency; errors; the backend against the GEMM peak;
   each as a ratio beside the bar a healthy deployment clears (comparisons.py).
Prints the tables and writes results.md (per body: served req/s beside its pipeline ceiling and the model
alone, with ratios to both; ratios to naive; how each row compares), results.json, comparisons.json and
throughput.png (report.py, comparisons.py). Numbers from one run on a shared machine: compare rows of
the same run only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from contract.errors import VisionExportError
from contract.files import atomic_write_text
from contract.policy import ServingPolicy
from contract.records import CLASSIFICATION, MANIFEST_NAME, Manifest
from export.package.archive import build_archive
from handlers.policy import machine_policy, this_machine_resources
from measure.command import run_load_command
from measure.inprocess import bench as inprocess
from measure.loadgen import require_hey
from measure.request_path import stages
from measure.served import ceiling, comparisons, peer, report
from measure.served.configurations import (
    CONFIGURATIONS,
    CORES,
    KSERVE,
    LITSERVE,
    NAIVE,
    NAIVE_CONFIG,
    OPTIONAL_ENGINES,
    RAY,
    build_naive_archive,
    ceiling_of,
    configuration,
    default_names,
    known,
    naive_policy,
    runnable,
    served_kind,
    task_refusals,
    ungated_verdict,
)
from measure.served.rows import DEFAULT_WARMUP_S, LoadPlan, Served, load_rows, raw_wire
from serving.deploy.common import DEFAULT_EXPORT_DIR
from serving.kserve import server as kserve_server
from serving.kserve.config import KServeSettings
from serving.settings import EXAMPLE_IMAGE, REQUEST_TIMEOUT_S, free_port
from serving.torchserve import server
from serving.torchserve.config import ServerSettings, on_free_ports

DEFAULT_DURATION_S = 20
DEFAULT_LEVELS = "1,4,8,16"


class BenchError(VisionExportError):
    """The benchmark cannot run as asked; the message says which option and what to give."""


# ------------------------------------------------------------------ one configuration, served
def prepare_server(name: str, export_dir: Path, manifest: Manifest, scratch: Path,
                   token_auth: bool) -> ServerSettings:
    row = configuration(name)
    store = scratch / name.replace(":", "-") / "store"
    settings = on_free_ports(store, store.parent / "run")
    settings.model_name = manifest.model.name
    settings.token_auth = token_auth
    settings.extra_env = dict(row.env)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    if name == NAIVE:
        build_naive_archive(export_dir, manifest, store)
        config = store.parent / "config.properties"
        config.write_text(NAIVE_CONFIG)
        settings.config, settings.policy = config, naive_policy()
    else:
        build_archive(export_dir, manifest, store, None, row.artifact, row.overrides, row.speed_only_ungated)
    return settings


def row_facts(name: str, manifest: Manifest) -> dict:
    kind = served_kind(name, manifest)
    gate = ungated_verdict(name, manifest)
    return {"model": manifest.model.name, "precision": manifest.artifacts[kind].precision, "artifact": kind,
            "ceiling": ceiling_of(name, manifest)[0], **({"gate": gate} if gate else {})}


@contextlib.contextmanager
def torchserve_served(name: str, export_dir: Path, manifest: Manifest, files: list[Path], scratch: Path,
                      token_auth: bool):
    settings = prepare_server(name, export_dir, manifest, scratch, token_auth)
    with server.running(settings, EXAMPLE_IMAGE) as process:
        yield Served(name, settings.predictions_url(), settings.response_timeout_s, raw_wire(files),
                     server.auth_headers(settings), settings.log_dir / "model_log.log", row_facts(name, manifest),
                     pid=process.pid)


@contextlib.contextmanager
def litserve_served(export_dir: Path, manifest: Manifest, files: list[Path], scratch: Path):
    folder = scratch / LITSERVE
    with peer.running(export_dir, folder, EXAMPLE_IMAGE) as litserve:
        wire = {path.name: (peer.form_body(path, folder), peer.FORM_CONTENT_TYPE) for path in files}
        yield Served(LITSERVE, litserve.url, REQUEST_TIMEOUT_S, wire, facts=row_facts(LITSERVE, manifest),
                     pid=litserve.process.pid)


@contextlib.contextmanager
def kserve_served(export_dir: Path, manifest: Manifest, files: list[Path], scratch: Path):
    """The export's archive in KServe's ModelServer (this machine's policy); each body sent as v1 JSON."""
    folder, name = scratch / KSERVE, manifest.model.name
    build_archive(export_dir, manifest, folder / "store")
    settings = KServeSettings(folder / "store", (name,), http_port=free_port(), run_dir=folder / "run")
    with kserve_server.running(settings, EXAMPLE_IMAGE) as process:
        wire = {}
        for path in files:
            body = folder / f"{path.name}.v1.json"
            body.write_text(json.dumps(kserve_server.v1_body(path)))
            wire[path.name] = (body, "application/json")
        yield Served(KSERVE, settings.predict_url(name), REQUEST_TIMEOUT_S, wire, model_log=settings.log_file,
                     facts=row_facts(KSERVE, manifest), pid=process.pid)


@contextlib.contextmanager
def ray_served(export_dir: Path, manifest: Manifest, files: list[Path], scratch: Path):
    """The export's archive as a Ray Serve application on a head node of its own (this machine's policy); each
    body sent raw, as to TorchServe."""
    from serving.ray.config import RaySettings
    from serving.ray.engine import RayServe
    folder, name = scratch / RAY, manifest.model.name
    build_archive(export_dir, manifest, folder / "store")
    settings = RaySettings(folder / "store", (name,), http_port=free_port(), run_dir=folder / "run",
                           signals_port=free_port())
    with RayServe(settings).running(EXAMPLE_IMAGE):
        yield Served(RAY, settings.predictions_url(name), REQUEST_TIMEOUT_S, raw_wire(files),
                     model_log=settings.log_file, facts=row_facts(RAY, manifest))


def bench_configuration(name: str, export_dir: Path, manifest: Manifest, files: list[Path], levels: list[int],
                        scratch: Path, plan: LoadPlan, token_auth: bool = False) -> list[dict]:
    """Every body (and the mix) at every concurrency against one configuration, started and stopped here."""
    if name == LITSERVE:
        served = litserve_served(export_dir, manifest, files, scratch)
    elif name == KSERVE:
        served = kserve_served(export_dir, manifest, files, scratch)
    elif name == RAY:
        served = ray_served(export_dir, manifest, files, scratch)
    else:
        served = torchserve_served(name, export_dir, manifest, files, scratch, token_auth)
    with served as target:
        return load_rows(target, levels, plan)


# ------------------------------------------------------------------ the ceilings beside the served rows
def inprocess_report(source: str, export_dir: Path, out: Path) -> inprocess.Report | None:
    if source == "none":
        return None
    if source != "run":
        return inprocess.load_report(Path(source))
    policy = machine_policy(*this_machine_resources())
    plan = inprocess.Plan(list(inprocess.DEFAULT_BATCHES),
                          inprocess.parse_threads(f"{policy.threads_per_worker},all", CORES))
    print(f"in-process benchmark of {export_dir} (threads {plan.threads}: the serving policy's and all cores)",
          flush=True)
    result = inprocess.run([export_dir], plan, say=lambda line: print(line, flush=True))
    inprocess.write_outputs(result, out)
    return result


def model_alone(measured: inprocess.Report | None, model: str, policy: ServingPolicy | None = None) -> tuple[dict, dict]:
    """The in-process rows of `model` as the served rows' ceilings, images/s per batch: the best of each
    precision, and each artifact kind's own (a served row is held to its own artifact alone where the run timed
    it). At each batch, the best of one process at any thread count, or the serving `policy`'s workers each
    running it at their thread budget (counted as the pipeline ceiling counts them: an upper bound, they share
    memory bandwidth); a detector runs one image at a time, so its workers, not its threads, are its parallelism.
    A bench.json of several models gives each its own rows."""
    rows = [r for r in measured.rows if r.model == model] if measured else []

    def per_batch(**which) -> dict[int, float]:
        rates = {b: r.images_per_s for b, r in inprocess.best_rows(rows, **which).items()}
        if policy is not None:
            per_worker = [r for r in rows if r.threads == policy.threads_per_worker and r.device == "cpu"]
            for b, r in inprocess.best_rows(per_worker, **which).items():
                rates[b] = max(rates.get(b, 0.0), policy.workers * r.images_per_s)
        return rates
    precisions = sorted({r.precision for r in rows})
    kinds = sorted({r.artifact for r in rows})
    return ({p: per_batch(precision=p) for p in precisions}, {k: per_batch(artifact=k) for k in kinds})


def best_fp32_peak_fraction(result: inprocess.Report | None) -> float | None:
    fractions = [r.peak_fraction for r in (result.rows if result else [])
                 if r.device == "cpu" and r.precision == "fp32" and r.peak_fraction is not None]
    return max(fractions) if fractions else None


def pipeline_ceilings(args, manifest: Manifest, names: list[str], files: list[Path]) -> ceiling.Ceilings | None:
    if args.pipeline == "none":
        return None
    gpus, cores = this_machine_resources()
    policy = machine_policy(gpus, cores)
    ceilings = ceiling.measure(args.export_dir, manifest, [ceiling_of(n, manifest) for n in names], files,
                                     policy, args.pipeline_seconds, "cuda" if gpus else "cpu")
    ceiling.write(ceilings, manifest, policy, cores, args.out)
    return ceilings


# ------------------------------------------------------------------ entry point
def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m measure bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export-dir", type=Path, default=DEFAULT_EXPORT_DIR)
    parser.add_argument("--images", "--image", dest="images", default=str(EXAMPLE_IMAGE),
                        help="the bodies to send: image files and folders of them, comma-separated (default: the "
                             "example JPEG; python -m examples.photo_sizes DIR writes the sizes users send)")
    parser.add_argument("--duration", type=int, default=DEFAULT_DURATION_S, help="seconds per row (default 20)")
    parser.add_argument("--requests", type=int, default=None, help="a fixed count per row instead of --duration")
    parser.add_argument("--concurrency", default=DEFAULT_LEVELS)
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP_S,
                        help="seconds of load on each server before its rows, so each is measured in its steady state "
                             "(TorchServe's frontend JIT-compiles over its first thousands of requests; default "
                             "%(default)s)")
    parser.add_argument("--configurations", default=None,
                        help=f"comma-separated, of {', '.join(CONFIGURATIONS)} and form:KIND (one of the export's "
                             "servable forms under the default policy). Default: all of them for a classifier (an "
                             "engine not installed is skipped, saying so); for a detector or segmenter, default, "
                             "each other servable form, kserve and ray")
    parser.add_argument("--inprocess", default="run",
                        help="run (default: the in-process benchmark first, same export), none, or a bench.json")
    parser.add_argument("--pipeline", choices=("run", "none"), default="run",
                        help="run (default): measure each body's pipeline ceiling first; none: leave it out")
    parser.add_argument("--pipeline-seconds", type=float, default=ceiling.DEFAULT_SECONDS,
                        help="timed seconds per body and artifact of the pipeline ceiling (default %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--token-auth", action="store_true", help="serve with token authorisation on")
    return parser.parse_args(argv)


def image_files(spec: str) -> list[Path]:
    """--images: every image of the files and folders named, once each (rows are keyed by file name)."""
    files = [path for part in spec.split(",") if part.strip() for path in stages.bodies(Path(part.strip()))]
    names = [path.name for path in files]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise BenchError(f"--images names {', '.join(twice)} more than once; rows are named after the file, "
                         "so give each body once")
    return files


def check(args) -> tuple[list[int], list[str], Manifest]:
    """The options checked before anything runs: (concurrencies, configurations, the export's manifest)."""
    if not (args.export_dir / MANIFEST_NAME).is_file():
        raise BenchError(f"{args.export_dir} has no {MANIFEST_NAME}: run `python -m export ...` first, "
                         "or pass --export-dir")
    levels = concurrency_levels(args)
    explicit = args.configurations is not None
    asked = [n for n in args.configurations.split(",") if n] if explicit else []
    unknown = [n for n in asked if not known(n)]
    if unknown:
        raise BenchError(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(CONFIGURATIONS)} "
                         "or form:KIND")
    manifest = Manifest.read(args.export_dir)
    names = asked if explicit else default_names(manifest)
    refused = task_refusals(names, manifest)
    if refused:
        raise BenchError(f"{manifest.model.name} is a {manifest.task} model; " + "; ".join(refused)
                         + ": leave these out of --configurations")
    if LITSERVE in names and not peer.installed():
        raise BenchError("the litserve configuration needs LitServe: pip install -e '.[dev]' (or pip install "
                         "litserve python-multipart), or leave litserve out of --configurations")
    names = with_installed_engines(names, explicit)
    require_hey()  # after the options, so a typo is reported on machines without hey too
    return levels, names, manifest


def concurrency_levels(args) -> list[int]:
    try:
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        raise BenchError(f"--concurrency {args.concurrency!r}: give integers separated by commas, e.g. 1,4,8,16") from None
    if not levels or min(levels) < 1 or args.duration < 1 or (args.requests is not None and args.requests < 1):
        raise BenchError("--concurrency, --duration and --requests must be at least 1")
    if args.warmup < 0:
        raise BenchError("--warmup: give seconds, 0 or more")
    return levels


def with_installed_engines(names: list[str], explicit: bool) -> list[str]:
    """names without the optional engines that are not installed: skipped with the reason when the list is the
    default one, refused when it was asked for."""
    missing = [n for n in names if n in OPTIONAL_ENGINES and importlib.util.find_spec(OPTIONAL_ENGINES[n]) is None]
    if missing and explicit:
        raise BenchError(f"the {', '.join(missing)} configuration needs its engine: pip install -e '.[{missing[0]}]', "
                         "or leave it out of --configurations")
    for name in missing:
        print(f"skipping {name}: its engine is not installed (pip install -e '.[{name}]')", flush=True)
    return [n for n in names if n not in missing]



def describe(names: list[str]) -> dict[str, str]:
    described = {name: configuration(name).description for name in names}
    if LITSERVE in described:
        described[LITSERVE] += f" (litserve {peer.litserve_version()})"
    return described


def _main(argv) -> int:
    args = parse_args(argv)
    levels, names, manifest = check(args)
    files = image_files(args.images)
    args.out.mkdir(parents=True, exist_ok=True)
    names = runnable(names, manifest)
    measured = inprocess_report(args.inprocess, args.export_dir, args.out)
    best, alone = model_alone(measured, manifest.model.name, machine_policy(*this_machine_resources()))
    ceilings = pipeline_ceilings(args, manifest, names, files)
    descriptions = describe(names)
    for name in names:
        print(f"{name}: {descriptions[name]}", flush=True)
    plan = LoadPlan(None if args.requests else args.duration, args.requests, args.warmup)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        for name in names:
            rows += bench_configuration(name, args.export_dir, manifest, files, levels, Path(scratch), plan,
                                        args.token_auth)
    report.add_ratios(rows, best, ceilings.of_row if ceilings else None, alone)
    compared = comparisons.compare(rows, reference_body(files), best_fp32_peak_fraction(measured),
                                   classifier=manifest.task == CLASSIFICATION)
    write_results(args, manifest, rows, compared, descriptions, best.get("fp32", {}))
    return 0


def reference_body(files: list[Path]) -> str:
    """The body the model-alone and fp32-ONNX comparisons use: the example photo when sent, else the first."""
    return EXAMPLE_IMAGE.name if any(path.name == EXAMPLE_IMAGE.name for path in files) else files[0].name


def write_results(args, manifest: Manifest, rows: list[dict], compared: list[comparisons.Comparison],
                  descriptions: dict[str, str], best_fp32: dict[int, float]) -> None:
    per_row = f"{args.requests} requests" if args.requests else f"{args.duration} s"
    header = (f"# Serving benchmark: {manifest.model.name} ({manifest.weights.get('kind', 'unrecorded')} weights), "
              f"{CORES} cores, {per_row} per row, hey")
    atomic_write_text(args.out / "results.md",
                      report.render_markdown(rows, comparisons.section(compared), descriptions, header))
    atomic_write_text(args.out / "results.json", json.dumps(rows, indent=2))
    atomic_write_text(args.out / "comparisons.json", json.dumps([c.record() for c in compared], indent=2))
    report.chart(rows, best_fp32, args.out / "throughput.png")
    print("\n" + report.sizes_table(rows) + "\n\n" + report.table(rows) + "\n\n" + comparisons.table(compared)
          + f"\n\nwrote {args.out}/results.md, results.json, comparisons.json, throughput.png")


def main(argv=None) -> int:
    return run_load_command(lambda: _main(argv))


if __name__ == "__main__":
    sys.exit(main())
