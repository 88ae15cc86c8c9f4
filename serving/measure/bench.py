"""Throughput and latency of the served model under load, per serving configuration, against an honest
baseline and the in-process ceiling measured in the same run.

  python -m serving.bench [--export-dir artifacts/resnet50] [--duration 20] [--concurrency 1,4,8,16]
                          [--configurations naive,default,...] [--inprocess run|none|bench.json]

1. In-process (unless --inprocess none or a bench.json is given): `python -m export bench` on the same
   export, at the serving thread count and all cores, with this machine's GEMM peak (bench.md/json/png).
2. For each configuration it builds an archive from the export folder, starts a real TorchServe on free
   loopback ports and drives it with `hey` (a real load generator) for a fixed duration at each concurrency
   (or a fixed count with --requests). `naive` is the baseline: the traced TorchScript behind a handler
   written as TorchServe's documentation teaches (serving/naive_handler.py), TorchServe's default worker
   count, no thread tuning, no batching.
3. Where the time goes: our handler logs decode/preprocess/inference/encode per batch (model_log.log, the
   same numbers as its Prometheus metrics); the medians per request of each row sit beside its throughput.
Prints a table and writes results.md (with ratios to the naive row at the same concurrency and to the best
in-process throughput at the largest measured batch <= the concurrency), results.json and throughput.png.
Numbers from one run on a shared machine: compare rows of the same run only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from export import bench as inprocess
from export.archive import build_archive, run_model_archiver
from export.atomic import atomic_write_text
from export.manifest import load_manifest
from handlers.image_classifier import STAGES
from handlers.policy import ServingPolicy, machine_policy, this_machine
from models.errors import VisionExportError
from serving import server

CORES = os.cpu_count() or 1
NAIVE = "naive"
NAIVE_HANDLER = Path(__file__).resolve().parent / "naive_handler.py"
NAIVE_ARTIFACT = "traced"
# TorchServe's own defaults for a CPU host (ConfigManager.getDefaultWorkers: a worker per processor when
# there is no GPU; batchSize 1, maxBatchDelay 100); the naive handler ignores our thread setting, so torch
# in each worker uses its default intra-op threads (every physical core).
TORCHSERVE_DEFAULT_BATCH_DELAY_MS = 100
DEFAULT_DURATION_S = 20
DEFAULT_LEVELS = "1,4,8,16"
HEY_TIMEOUT_S = 120  # per request; TorchServe's responseTimeout is 120 s too
WARMUP_REQUESTS_PER_CLIENT = 2
LOG_FLUSH_S = 1.0  # the frontend copies worker stdout into model_log.log asynchronously
TARGET_VS_INPROCESS = 0.9  # issue 10: served at concurrency 8 >= 0.9 x the best in-process batch-8 throughput
TARGET_VS_NAIVE = 4.0  # ... and >= 4 x the naive baseline at concurrency 8
TARGET_PEAK_FRACTION = 0.7  # the best fp32 backend at >= 70 % of the measured fp32 GEMM peak
TARGET_CONCURRENCY = 8
TARGET_INT8_REQ_PER_S = 100  # issue 11: the int8 artifact served at concurrency 8, zero errors
TARGET_TAIL_RATIO = 2.0  # ... with p99 <= 2 x p50
INT8 = "int8"
STAGE_LINE = re.compile(r"batch of (\d+): (.*)$")
STAGE_VALUE = re.compile(r"(\w+)=([\d.]+)ms")


@dataclass(frozen=True)
class Configuration:
    description: str
    artifact: str | None = None  # None: the export's served artifact
    overrides: dict = field(default_factory=dict)  # pinned model-config keys (win over the serve-time policy)
    env: dict = field(default_factory=dict)  # extra environment for TorchServe and its workers
    speed_only_ungated: bool = False  # may serve a variant that failed its accuracy gate, labelled as such


CONFIGURATIONS = {
    NAIVE: Configuration("baseline: traced TorchScript, a handler as TorchServe's docs teach (PIL + torchvision "
                         "transforms), TorchServe's default workers (one per core), torch's default threads, "
                         "no batching", NAIVE_ARTIFACT),
    "default": Configuration("the policy `python -m serving` decides for this machine, the export's served artifact"),
    "int8": Configuration("the default policy with the int8 ONNX (export --precision fp32,int8); when its "
                          "accuracy gate failed (random weights) it is served here for its speed only and the "
                          "row says so", "onnx-int8", speed_only_ungated=True),
    "fp32-onnx": Configuration("the default policy with the fp32 ONNX: what a gated onnx-int8 (export --precision "
                               "fp32,int8) replaces as the served artifact", "onnx-dynamo"),
    "workers-batched": Configuration("a worker per core with 1 thread each, batches of up to 4 within 20 ms", None,
                                     {"minWorkers": CORES, "maxWorkers": CORES, "batchSize": 4, "maxBatchDelay": 20,
                                      "threads": 1}, {"OMP_NUM_THREADS": "1"}),
    "batched": Configuration("one worker using every core, batches of up to 8 within 50 ms (the GPU policy)", None,
                             {"minWorkers": 1, "maxWorkers": 1, "batchSize": 8, "maxBatchDelay": 50,
                              "threads": CORES}),
    "torchscript": Configuration("the default policy with the scripted TorchScript artifact", "scripted"),
    "oversubscribed": Configuration("our handler with TorchServe-like threading: a worker per core, each using "
                                    "every core, no batching", None,
                                    {"minWorkers": CORES, "maxWorkers": CORES, "batchSize": 1, "threads": CORES}),
}


class BenchError(VisionExportError):
    """The benchmark cannot run as asked, or the load generator failed; the message says which."""


@dataclass
class Load:
    """One run of the load generator."""
    requests: int
    req_per_s: float
    p50_ms: float | None  # None: hey prints a percentile only when there are enough requests (p99: >= 100)
    p90_ms: float | None
    p99_ms: float | None
    failed: int  # non-200 answers plus requests that got no answer


# ------------------------------------------------------------------ pure functions
def parse_hey(output: str) -> Load:
    """Requests/s, latency percentiles and failures from hey's summary."""
    def number(pattern: str, scale: float = 1.0) -> float | None:
        match = re.search(pattern, output)
        return float(match.group(1)) * scale if match else None

    statuses = {int(code): int(count) for code, count in re.findall(r"\[(\d{3})\]\s+(\d+) responses", output)}
    errors_section = output.split("Error distribution:", 1)[1] if "Error distribution:" in output else ""
    unanswered = sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]", errors_section, re.MULTILINE))
    return Load(requests=sum(statuses.values()) + unanswered, req_per_s=number(r"Requests/sec:\s+([\d.]+)") or 0.0,
                p50_ms=number(r"50%\s+in\s+([\d.]+)\s+secs", 1000), p90_ms=number(r"90%\s+in\s+([\d.]+)\s+secs", 1000),
                p99_ms=number(r"99%\s+in\s+([\d.]+)\s+secs", 1000),
                failed=sum(n for code, n in statuses.items() if code != 200) + unanswered)


def parse_stage_lines(text: str) -> list[tuple[int, dict[str, float]]]:
    """(batch size, {stage: ms for the batch}) for each `batch of N: decode=..ms ...` line the handler logged."""
    found = []
    for line in text.splitlines():
        match = STAGE_LINE.search(line)
        if match:
            values = {name: float(ms) for name, ms in STAGE_VALUE.findall(match.group(2)) if name in STAGES}
            if set(values) == set(STAGES):
                found.append((int(match.group(1)), values))
    return found


def stage_medians(batches: list[tuple[int, dict[str, float]]]) -> dict:
    """Median per request of each stage (a batch's time divided by its size), and the median batch size."""
    if not batches:
        return {}
    medians = {stage: statistics.median(values[stage] / size for size, values in batches) for stage in STAGES}
    return {**medians, "batch": statistics.median(size for size, _ in batches), "batches": len(batches)}


def inprocess_batch_for(concurrency: int, batches: list[int]) -> int | None:
    """The largest in-process batch <= the concurrency: at most that many requests can be in one batch."""
    fitting = [b for b in batches if b <= concurrency]
    return max(fitting) if fitting else None


def ratio(value: float, reference: float | None) -> float | None:
    return value / reference if reference else None


def add_ratios(rows: list[dict], best_by_precision: dict[str, dict[int, float]]) -> list[dict]:
    """Each row gains vs_naive (same concurrency) and vs_inprocess (the best in-process row of the served
    artifact's precision at the largest batch <= the concurrency: an int8 row is held to int8's ceiling)."""
    naive = {r["concurrency"]: r["req_per_s"] for r in rows if r["configuration"] == NAIVE}
    for row in rows:
        best_inprocess = best_by_precision.get(row.get("precision", "fp32"), {})
        batch = inprocess_batch_for(row["concurrency"], sorted(best_inprocess))
        row["vs_naive"] = ratio(row["req_per_s"], naive.get(row["concurrency"]))
        row["inprocess_batch"] = batch
        row["vs_inprocess"] = ratio(row["req_per_s"], best_inprocess.get(batch)) if batch else None
    return rows


@dataclass
class Target:
    name: str
    value: float | None
    threshold: float
    met: bool | None  # None: not measured in this run
    detail: str
    at_most: bool = False  # the value must be <= threshold (else >=)


def evaluate_targets(rows: list[dict], best_inprocess: dict[int, float], fp32_peak_fraction: float | None,
                     configuration: str = "default") -> list[Target]:
    """Issue 10's targets, as ratios from this run."""
    served = next((r for r in rows if r["configuration"] == configuration and r["concurrency"] == TARGET_CONCURRENCY),
                  None)
    naive = next((r for r in rows if r["configuration"] == NAIVE and r["concurrency"] == TARGET_CONCURRENCY), None)
    vs_inprocess = ratio(served["req_per_s"], best_inprocess.get(TARGET_CONCURRENCY)) if served else None
    vs_naive = ratio(served["req_per_s"], naive["req_per_s"]) if served and naive else None

    def target(name, value, threshold, detail):
        return Target(name, value, threshold, None if value is None else value >= threshold, detail)

    return precision_targets(rows) + [
        target(f"served ({configuration}) at c={TARGET_CONCURRENCY} / best in-process batch {TARGET_CONCURRENCY}",
               vs_inprocess, TARGET_VS_INPROCESS,
               f"{served['req_per_s']:.1f} req/s vs {best_inprocess[TARGET_CONCURRENCY]:.1f} img/s"
               if vs_inprocess is not None else "not measured"),
        target(f"served ({configuration}) / naive at c={TARGET_CONCURRENCY}", vs_naive, TARGET_VS_NAIVE,
               f"{served['req_per_s']:.1f} vs {naive['req_per_s']:.1f} req/s" if vs_naive is not None
               else "not measured"),
        target("best fp32 in-process backend / measured fp32 GEMM peak", fp32_peak_fraction, TARGET_PEAK_FRACTION,
               "from the in-process benchmark" if fp32_peak_fraction is not None else "not measured"),
    ]


def precision_targets(rows: list[dict]) -> list[Target]:
    """Issue 11's: the int8 row at concurrency 8 (only when the run has one)."""
    int8 = next((r for r in rows if r["configuration"] == INT8 and r["concurrency"] == TARGET_CONCURRENCY), None)
    if int8 is None:
        return []
    label = f"int8 served at c={TARGET_CONCURRENCY}" + (f" ({int8['gate']})" if int8.get("gate") else "")
    tail = int8["p99_ms"] / int8["p50_ms"] if int8.get("p99_ms") and int8.get("p50_ms") else None
    return [Target(f"{label}: req/s, 0 errors", int8["req_per_s"], TARGET_INT8_REQ_PER_S,
                   int8["req_per_s"] >= TARGET_INT8_REQ_PER_S and int8["failed"] == 0,
                   f"{int8['req_per_s']:.1f} req/s, {int8['failed']} errors"),
            Target(f"{label}: p99 / p50", tail, TARGET_TAIL_RATIO, None if tail is None else tail <= TARGET_TAIL_RATIO,
                   f"p50 {int8['p50_ms']:.0f} ms, p99 {_cell(int8.get('p99_ms'), '{:.0f}')} ms", at_most=True)]


def _cell(value: float | None, fmt: str = "{:.2f}") -> str:
    return fmt.format(value) if value is not None else "—"


def table(rows: list[dict]) -> str:
    stage_headers = " | ".join(f"{s} ms" for s in STAGES)
    lines = [f"| configuration | c | req/s | p50 ms | p90 ms | p99 ms | errors | × naive | × in-process (batch) | "
             f"{stage_headers} | batch |", "|---|---|---|---|---|---|---|---|---|" + "---|" * len(STAGES) + "---|"]
    for r in rows:
        stages = r.get("stages_ms") or {}
        inprocess_cell = (f"{r['vs_inprocess']:.2f} ({r['inprocess_batch']})" if r.get("vs_inprocess") is not None
                          else "—")
        name = r["configuration"] + (" (speed only, gate failed)" if r.get("gate") else "")
        lines.append(f"| {name} | {r['concurrency']} | {r['req_per_s']:.1f} | {_cell(r['p50_ms'], '{:.0f}')} | "
                     f"{_cell(r['p90_ms'], '{:.0f}')} | {_cell(r['p99_ms'], '{:.0f}')} | {r['failed']} | "
                     f"{_cell(r.get('vs_naive'))} | "
                     f"{inprocess_cell} | " + " | ".join(_cell(stages.get(s), "{:.1f}") for s in STAGES)
                     + f" | {_cell(stages.get('batch'), '{:.0f}')} |")
    return "\n".join(lines)


def targets_table(targets: list[Target]) -> str:
    lines = ["| target | measured | needed | met | numbers |", "|---|---|---|---|---|"]
    lines += [f"| {t.name} | {_cell(t.value)} | {'≤' if t.at_most else '≥'} {t.threshold:g} | "
              f"{'yes' if t.met else 'no' if t.met is not None else '—'} | {t.detail} |" for t in targets]
    return "\n".join(lines)


# ------------------------------------------------------------------ load and logs
def run_hey(url: str, image: Path, concurrency: int, duration_s: int | None, requests: int | None,
            headers: dict | None = None) -> Load:
    command = ["hey", "-c", str(concurrency), "-t", str(HEY_TIMEOUT_S), "-m", "POST", "-T", "image/jpeg",
               "-D", str(image)]
    command += ["-z", f"{duration_s}s"] if requests is None else ["-n", str(requests)]
    command += [part for name, value in (headers or {}).items() for part in ("-H", f"{name}: {value}")] + [url]
    bound = (duration_s or 0) + HEY_TIMEOUT_S + (requests or 0) * 10 + 60
    done = subprocess.run(command, capture_output=True, text=True, timeout=bound)
    if done.returncode != 0:
        raise BenchError(f"hey exited with {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    return parse_hey(done.stdout)


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def read_from(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


# ------------------------------------------------------------------ servers
NAIVE_CONFIG = """# TorchServe with its defaults, on loopback only (the naive baseline of python -m serving.bench)
inference_address=http://127.0.0.1:8080
management_address=http://127.0.0.1:8081
metrics_address=http://127.0.0.1:8082
grpc_inference_address=127.0.0.1
grpc_management_address=127.0.0.1
enable_envvars_config=true
disable_token_authorization=true
enable_model_api=false
"""


def naive_policy() -> ServingPolicy:
    return ServingPolicy(CORES, 1, TORCHSERVE_DEFAULT_BATCH_DELAY_MS, CORES, "cpu",
                         "TorchServe's defaults: a worker per core, no batching (threads not tuned)")


def build_naive_archive(export_dir: Path, store: Path) -> Path:
    """torch-model-archiver as its docs show: the traced .pt, the naive handler, the labels."""
    manifest = load_manifest(export_dir)
    labels = [export_dir / f for f in manifest.files if f.endswith("index_to_name.json")]
    store.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "model_archiver.model_packaging", "--model-name", "resnet", "--version", "1.0",
               "--serialized-file", str(export_dir / manifest.artifacts[NAIVE_ARTIFACT]["path"]),
               "--handler", str(NAIVE_HANDLER), "--export-path", str(store), "--force"]
    command += ["--extra-files", ",".join(map(str, labels))] if labels else []
    done = run_model_archiver(command, store)
    if done.returncode != 0:
        raise BenchError(f"torch-model-archiver failed for the naive baseline: {(done.stderr or done.stdout)[-400:]}")
    return store / "resnet.mar"


def prepare_server(name: str, export_dir: Path, scratch: Path, token_auth: bool) -> server.ServerSettings:
    configuration = CONFIGURATIONS[name]
    store = scratch / name / "store"
    settings = server.on_free_ports(store, scratch / name / "run")
    settings.token_auth = token_auth
    settings.extra_env = dict(configuration.env)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    if name == NAIVE:
        build_naive_archive(export_dir, store)
        config = scratch / name / "config.properties"
        config.write_text(NAIVE_CONFIG)
        settings.config, settings.policy = config, naive_policy()
    else:
        build_archive(export_dir, load_manifest(export_dir), store, "resnet", configuration.artifact,
                      configuration.overrides, configuration.speed_only_ungated)
    return settings


def bench_configuration(name: str, export_dir: Path, image: Path, levels: list[int], scratch: Path,
                        duration_s: int | None, requests: int | None, token_auth: bool = False) -> list[dict]:
    settings = prepare_server(name, export_dir, scratch, token_auth)
    manifest = load_manifest(export_dir)
    gate = ungated_verdict(name, manifest)
    precision = served_precision(name, manifest)
    model_log = settings.log_dir / "model_log.log"
    rows = []
    with server.running(settings, image):
        headers = server.auth_headers(settings)
        run_hey(settings.predictions_url(), image, max(levels), None, WARMUP_REQUESTS_PER_CLIENT * max(levels),
                headers)
        for level in levels:
            time.sleep(LOG_FLUSH_S)
            offset = log_size(model_log)
            load = run_hey(settings.predictions_url(), image, level, duration_s, requests, headers)
            time.sleep(LOG_FLUSH_S)
            stages = stage_medians(parse_stage_lines(read_from(model_log, offset)))
            row = {"configuration": name, "precision": precision, "concurrency": level, "duration_s": duration_s,
                   **asdict(load),
                   "stages_ms": stages, **({"gate": gate} if gate else {})}
            print(f"  {name:<15} c={level:<3} {load.req_per_s:7.1f} req/s  p50 {_cell(load.p50_ms, '{:.0f}'):>5}  "
                  f"p90 {_cell(load.p90_ms, '{:.0f}'):>5}  p99 {_cell(load.p99_ms, '{:.0f}'):>5} ms  errors {load.failed}"
                  + ("  per request: " + " ".join(f"{s} {stages[s]:.1f}" for s in STAGES)
                     + f" ms (median batch {stages['batch']:.0f})" if stages else ""), flush=True)
            rows.append(row)
    return rows


def ungated_verdict(name: str, manifest) -> str | None:
    """'speed only: accuracy gate failed: ...' when this configuration serves a variant that failed its gate."""
    artifact = CONFIGURATIONS[name].artifact
    why_not = str(manifest.serving.get("candidates", {}).get(artifact, ""))
    if CONFIGURATIONS[name].speed_only_ungated and why_not.startswith("accuracy gate"):
        print(f"  {name}: SPEED ONLY, NOT SERVABLE: {artifact} {why_not}", flush=True)
        return f"speed only, {why_not}"
    return None


def served_precision(name: str, manifest) -> str:
    artifact = CONFIGURATIONS[name].artifact or manifest.serving.get("default_artifact")
    return manifest.artifacts.get(artifact, {}).get("precision", "fp32")


def runnable(names: list[str], manifest) -> list[str]:
    """The configurations whose artifact this export has and that are not the default row again; the others
    are named and skipped."""
    served = manifest.serving.get("default_artifact")
    kept = []
    for name in names:
        artifact = CONFIGURATIONS[name].artifact
        if artifact is not None and artifact not in manifest.artifacts:
            print(f"skipping {name}: this export has no {artifact} "
                  f"(python -m export resnet --precision fp32,int8 adds onnx-int8)", flush=True)
        elif artifact == served and name != NAIVE and not CONFIGURATIONS[name].overrides and "default" in names:
            print(f"skipping {name}: the export serves {artifact} already, so it is the default row", flush=True)
        else:
            kept.append(name)
    return kept


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
    report = inprocess.run([export_dir], plan, say=lambda line: print(line, flush=True))
    inprocess.write_outputs(report, out)
    return report


def best_fp32_peak_fraction(report: inprocess.Report | None) -> float | None:
    fractions = [r.peak_fraction for r in (report.rows if report else [])
                 if r.device == "cpu" and r.precision == "fp32" and r.peak_fraction is not None]
    return max(fractions) if fractions else None


def chart(rows: list[dict], best_inprocess: dict[int, float], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7.5, 4.2))
    for name in dict.fromkeys(r["configuration"] for r in rows):
        mine = [r for r in rows if r["configuration"] == name]
        axis.plot([r["concurrency"] for r in mine], [r["req_per_s"] for r in mine], marker="o", label=name,
                  linestyle="--" if name == NAIVE else "-")
    for batch, value in best_inprocess.items():
        axis.axhline(value, color="grey", linewidth=0.8, linestyle=":")
        axis.annotate(f"in-process best fp32, batch {batch}", (axis.get_xlim()[0], value), fontsize=7, color="grey",
                      va="bottom")
    axis.set_xlabel("concurrent clients")
    axis.set_ylabel("requests / second")
    axis.set_title("TorchServe throughput by configuration (one run)")
    axis.set_xscale("log", base=2)
    axis.set_ylim(bottom=0)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def ungated_note(rows: list[dict]) -> str:
    gates = sorted({f"`{r['configuration']}`: {r['gate']}" for r in rows if r.get("gate")})
    return ("Rows marked *speed only* served a variant that failed its accuracy gate, to measure its speed; "
            "`python -m serving` and the export's archive never serve it. " + "; ".join(gates) + "\n\n") if gates else ""


def render_markdown(rows: list[dict], targets: list[Target], names: list[str], header: str) -> str:
    described = "\n".join(f"- `{n}`: {CONFIGURATIONS[n].description}" for n in names)
    return (f"{header}\n\n{described}\n\n{table(rows)}\n\nStage columns: medians per request from the handler's "
            f"log (a batch's time divided by its size); `batch` is the median batch size. The naive handler logs "
            f"no stages.\n\n{ungated_note(rows)}## Targets (issue 10)\n\n{targets_table(targets)}\n")


# ------------------------------------------------------------------ entry point
def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m serving.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export-dir", type=Path, default=Path("artifacts/resnet50"))
    parser.add_argument("--image", type=Path, default=server.EXAMPLE_IMAGE)
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
    if not (args.export_dir / "manifest.json").is_file():
        raise BenchError(f"{args.export_dir} has no manifest.json: run `python -m export resnet` first")
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
    if not shutil.which("hey"):  # after the options, so a typo is reported on machines without hey too
        raise BenchError("the load generator `hey` is not installed: apt-get install hey")
    return levels, names


def _main(argv) -> int:
    args = parse_args(argv)
    levels, names = check(args)
    args.out.mkdir(parents=True, exist_ok=True)
    names = runnable(names, load_manifest(args.export_dir))
    report = inprocess_report(args.inprocess, args.export_dir, args.out)
    best = {precision: {b: r.images_per_s for b, r in inprocess.best_rows(report.rows, precision=precision).items()}
            for precision in ("fp32", "int8")} if report else {}
    for name in names:
        print(f"{name}: {CONFIGURATIONS[name].description}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        for name in names:
            rows += bench_configuration(name, args.export_dir, args.image, levels, Path(scratch),
                                        None if args.requests else args.duration, args.requests, args.token_auth)
    add_ratios(rows, best)
    targets = evaluate_targets(rows, best.get("fp32", {}), best_fp32_peak_fraction(report))
    manifest = load_manifest(args.export_dir)
    per_row = f"{args.requests} requests" if args.requests else f"{args.duration} s"
    header = (f"# Serving benchmark: {manifest.model['name']} ({manifest.weights['kind']} weights), {CORES} cores, "
              f"{per_row} per row, hey")
    atomic_write_text(args.out / "results.md", render_markdown(rows, targets, names, header))
    atomic_write_text(args.out / "results.json", json.dumps(rows, indent=2))
    atomic_write_text(args.out / "targets.json", json.dumps([asdict(t) for t in targets], indent=2))
    chart(rows, best.get("fp32", {}), args.out / "throughput.png")
    print("\n" + table(rows) + "\n\n" + targets_table(targets)
          + f"\n\nwrote {args.out}/results.md, results.json, targets.json, throughput.png")
    return 0


def main(argv=None) -> int:
    from export.cli import run_command
    return run_command(lambda: _main(argv), interrupted="interrupted; TorchServe stopped")


if __name__ == "__main__":
    sys.exit(main())
