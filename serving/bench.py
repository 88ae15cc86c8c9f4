"""Throughput and latency of the served model under load, per serving configuration.

  python -m serving.bench [--export-dir artifacts/resnet50] [--requests 200] [--concurrency 1,2,4,8]

For each configuration it builds an archive from the export folder, starts a real TorchServe on free
loopback ports, and drives it with ApacheBench (`ab`, Debian's apache2-utils: a real load generator, not a
Python loop) at each concurrency. Prints a table, and writes results.md, results.json and throughput.png
to bench-results/. Numbers from one run on a shared machine: compare rows of the same run only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from export.archive import build_archive
from export.manifest import load_manifest
from handlers.policy import machine_policy
from models.errors import VisionExportError
from serving import server

CORES = os.cpu_count() or 1
# name -> (artifact or None for the export's default, model-config overrides, what it shows)
CONFIGURATIONS = {
    "default": (None, {}, "the policy `python -m serving` decides for this machine, the default artifact"),
    "batched": (None, {**machine_policy(gpus=1, cores=CORES).model_config(), "threads": CORES},
                "the GPU policy on this CPU: 1 worker x all cores, batches of up to 8 within 50 ms"),
    "torchscript": ("scripted", {}, "the default model-config with the TorchScript backend"),
    "oversubscribed": (None, {"minWorkers": CORES, "maxWorkers": CORES, "batchSize": 1, "threads": CORES},
                       "TorchServe-like defaults: a worker per core, each using every core, no batching"),
}


class BenchError(VisionExportError):
    """The load generator failed; its own message is included."""


def run_ab(url: str, image: Path, requests: int, concurrency: int, headers: dict | None = None) -> dict:
    # -k: keep-alive; TorchServe holds HTTP/1.0 connections open, so plain ab would wait out its timeout
    command = ["ab", "-q", "-k", "-n", str(requests), "-c", str(concurrency), "-p", str(image), "-T", "image/jpeg"]
    command += [part for name, value in (headers or {}).items() for part in ("-H", f"{name}: {value}")] + [url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise BenchError(f"ab exited with {result.returncode}: {(result.stderr or result.stdout).strip()[-300:]}")
    output = result.stdout

    def number(pattern: str) -> float:
        match = re.search(pattern, output, re.MULTILINE)
        return float(match.group(1)) if match else float("nan")

    return {
        "concurrency": concurrency,
        "requests": requests,
        "req_per_s": number(r"Requests per second:\s+([\d.]+)"),
        "p50_ms": number(r"^\s+50%\s+(\d+)"),
        "p90_ms": number(r"^\s+90%\s+(\d+)"),
        "p99_ms": number(r"^\s+99%\s+(\d+)"),
        "failed": sum(int(m) for m in re.findall(r"(?:Failed requests|Non-2xx responses):\s+(\d+)", output)),
    }


def bench_configuration(name: str, export_dir: Path, image: Path, requests: int, levels: list[int],
                        scratch: Path, token_auth: bool = False) -> list[dict]:
    artifact, overrides, _ = CONFIGURATIONS[name]
    store = scratch / name / "store"
    build_archive(export_dir, load_manifest(export_dir), store, "resnet", artifact, overrides)
    settings = server.on_free_ports(store, scratch / name / "run")
    settings.token_auth = token_auth
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with server.running(settings, image):
        headers = server.auth_headers(settings)
        run_ab(settings.predictions_url(), image, max(10, requests // 10), max(levels), headers)  # warm-up
        for level in levels:
            row = {"configuration": name, **run_ab(settings.predictions_url(), image, requests, level, headers)}
            print(f"  {name:<15} c={level:<3} {row['req_per_s']:7.1f} req/s  p50 {row['p50_ms']:6.0f} ms  "
                  f"p99 {row['p99_ms']:6.0f} ms  failed {row['failed']}", flush=True)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| configuration | concurrency | req/s | p50 ms | p90 ms | p99 ms | failed |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['configuration']} | {r['concurrency']} | {r['req_per_s']:.1f} | {r['p50_ms']:.0f} | "
              f"{r['p90_ms']:.0f} | {r['p99_ms']:.0f} | {r['failed']} |" for r in rows]
    return "\n".join(lines)


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 4))
    for name in dict.fromkeys(r["configuration"] for r in rows):
        mine = [r for r in rows if r["configuration"] == name]
        axis.plot([r["concurrency"] for r in mine], [r["req_per_s"] for r in mine], marker="o", label=name)
    axis.set_xlabel("concurrent clients")
    axis.set_ylabel("requests / second")
    axis.set_title("TorchServe throughput by configuration (one run)")
    axis.set_xscale("log", base=2)
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export-dir", type=Path, default=Path("artifacts/resnet50"))
    parser.add_argument("--image", type=Path, default=server.EXAMPLE_IMAGE)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--configurations", default=",".join(CONFIGURATIONS))
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--token-auth", action="store_true", help="serve with token authorisation on")
    args = parser.parse_args(argv)
    if not shutil.which("ab"):
        print("error: ApacheBench (ab) is not installed: apt-get install apache2-utils", file=sys.stderr)
        return 1
    if not (args.export_dir / "manifest.json").is_file():
        print(f"error: {args.export_dir} has no manifest.json: run `python -m export resnet` first", file=sys.stderr)
        return 1
    levels = [int(c) for c in args.concurrency.split(",")]
    names = [n for n in args.configurations.split(",") if n]
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        print(f"error: unknown configuration(s) {unknown}; choose from {', '.join(CONFIGURATIONS)}", file=sys.stderr)
        return 1
    for name in names:
        print(f"{name}: {CONFIGURATIONS[name][2]}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        for name in names:
            rows += bench_configuration(name, args.export_dir, args.image, args.requests, levels, Path(scratch),
                                        args.token_auth)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(args.export_dir)
    header = (f"# Serving benchmark: {manifest.model['name']} ({manifest.weights['kind']} weights), {CORES} cores, "
              f"{args.requests} requests per row, ApacheBench\n\n")
    (args.out / "results.md").write_text(header + table(rows) + "\n")
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    chart(rows, args.out / "throughput.png")
    print("\n" + table(rows) + f"\n\nwrote {args.out}/results.md, results.json, throughput.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
