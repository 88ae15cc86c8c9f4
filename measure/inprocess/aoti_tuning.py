"""`python -m measure aoti-tuning`: AOTInductor's CPU options measured on one model in one run.

Each configuration compiles the model's torch.export program with other Inductor settings (freezing, oneDNN
weight pre-packing, max-autotune, a static or a dynamic batch; AOTInductor always generates a C++ wrapper, so
that option of torch.compile has nothing to switch here) and times it at each batch and thread count, beside
eager, the ExportedProgram and ONNX Runtime (the torch.export-based ONNX of the same program) from the same run;
max abs error against eager says each is still the same model. Writes aoti-tuning.md / .json / .png.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from contract.files import atomic_write_text
from export.forms import exporters
from export.forms.torch_export import AOTI_CONFIGS, compile_package
from measure.inprocess.report import machine_info
from runtime import RunOptions, open_artifact
from runtime.eager import EagerBackend
from runtime.timing import time_runs

WARMUP, REPEATS = 2, 5

@dataclass(frozen=True)
class Configuration:
    name: str
    inductor: dict
    static: bool  # compiled for each timed batch size exactly (else one package with a dynamic batch)
    what: str


CONFIGURATIONS = (
    Configuration("default", {}, False, "aoti_compile_and_package's defaults: the weights compiled in as "
                  "constants, convolutions calling ATen (oneDNN), the rest Inductor's own C++ kernels"),
    Configuration("default-static", {}, True, "the same, compiled for each timed batch size exactly"),
    Configuration("freezing", {"freezing": True}, False, "Inductor's freezing pass: constant folding, BatchNorm "
                  "into the convolutions, oneDNN weight pre-packing where it applies"),
    Configuration("freezing-no-prepack", {"freezing": True, "cpp.weight_prepack": False}, False,
                  "freezing without oneDNN's weight pre-packing (what oneDNN adds)"),
    Configuration("freezing-static", {"freezing": True}, True, "freezing, compiled for each timed batch size"),
    Configuration("freezing-max-autotune", {"freezing": True, "max_autotune": True}, False,
                  "freezing, and Inductor's C++ GEMM templates benchmarked against oneDNN at compile time"),
    Configuration("shipped", AOTI_CONFIGS, False, "what the aotinductor kind compiles with (export.forms.torch_export)"),
)


@dataclass
class Result:
    configuration: str
    batch: int | None
    compile_s: float | None
    max_abs: float | None
    images_per_s: dict = field(default_factory=dict)  # "threads x batch" -> images/s
    error: str = ""
    code: str = ""  # Inductor's hashes of the generated wrapper and kernels: equal = the same code


@dataclass(frozen=True)
class Plan:
    batches: list[int]
    threads: list[int]
    shape: tuple  # one image's (C, H, W): the model's example size
    busy_cores: int = 0  # processes spinning on the CPU while timing


def run(entry, names: list[str], batches: list[int], threads: list[int], say=print, busy_cores: int = 0) -> dict:
    module = entry.build("random").module.eval()
    form = exporters.torch_export_form(module).eval()
    program = exporters.export_program(form, entry.example_input(), spatial_dynamic=False)
    plan = Plan(batches, threads, tuple(entry.example_input().shape[1:]), busy_cores)
    baselines = _baselines(module, program, plan, say)
    results = []
    for configuration in (c for c in CONFIGURATIONS if c.name in names):
        for batch in (batches if configuration.static else [None]):
            results.append(_tune(configuration, form, module, entry.example_input(), program, batch, plan, say))
    return {"model": entry.name, "machine": machine_info(), "batches": batches, "threads": threads,
            "busy_cores": busy_cores, "baselines": [asdict(b) for b in baselines],
            "results": [asdict(r) for r in results],
            "configurations": {c.name: {"inductor": c.inductor, "what": c.what} for c in CONFIGURATIONS}}


def _baselines(module, program, plan: Plan, say) -> list[Result]:
    rows = [Result("eager", None, None, 0.0, _timings(EagerBackend(module), plan))]
    rows.append(Result("exported program", None, None, None, _timings(program.module(), plan)))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        with contextlib.redirect_stdout(io.StringIO()):  # the exporter's own progress lines
            torch.onnx.export(program, dynamo=True, external_data=False).save(str(path), external_data=False)
        onnx = {t: open_artifact("onnx", path, RunOptions(threads=t)) for t in plan.threads}
        rows.append(Result("onnx runtime", None, None, None, _timings(onnx, plan)))
    for row in rows:
        say(_line(row))
    return rows


def _tune(configuration, form, module, example, program, batch, plan: Plan, say) -> Result:
    """Compile one configuration (at one static batch, or dynamic), load it, check it, time it."""
    timed = plan.batches if batch is None else [batch]
    if batch is not None:
        program = torch.export.export(form, (example.repeat(batch, 1, 1, 1),))
    started = time.perf_counter()
    try:
        runner, code = _compile_and_load(program, configuration.inductor)
    except Exception as error:  # noqa: BLE001 - an option Inductor cannot apply here is a result, not a crash
        result = Result(configuration.name, batch, None, None, error=f"{type(error).__name__}: {str(error)[:200]}")
        say(_line(result))
        return result
    compile_s = time.perf_counter() - started
    probe = torch.rand(timed[0], *plan.shape)
    with torch.inference_mode():
        max_abs = (runner(probe) - module(probe)).abs().max().item()
    result = Result(configuration.name, batch, round(compile_s, 1), max_abs, _timings(runner, plan, timed), code=code)
    say(_line(result))
    return result


def _compile_and_load(program, inductor: dict):
    """Compiled cold: Inductor's on-disk cache (kernels, whole graphs) would make a repeated compile of the same
    model look several times faster than a user's first one, so each compile gets an empty cache folder."""
    from torch._inductor import aoti_load_package
    folder = Path(tempfile.mkdtemp(prefix="aoti-tuning-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor-cache")
    package = compile_package(program, "cpu", inductor)
    path = folder / "tuning.pt2"
    path.write_bytes(package.data)
    return aoti_load_package(str(path)), package.code


def _timings(runner, plan: Plan, batches: list[int] | None = None) -> dict:
    """images/s (median run) at each thread count x batch; `runner` may be one per thread count. With
    --busy-cores, that many processes spin on the CPU meanwhile (a shared machine, or other serving workers)."""
    out = {}
    with _busy(plan.busy_cores):
        for count in plan.threads:
            torch.set_num_threads(count)
            run = runner[count] if isinstance(runner, dict) else runner
            for batch in batches or plan.batches:
                x = torch.rand(batch, *plan.shape)
                with torch.inference_mode():
                    ms = statistics.median(time_runs(lambda run=run, x=x: run(x), WARMUP, REPEATS))
                out[f"{count}x{batch}"] = round(batch * 1000 / ms, 2)
    return out


@contextlib.contextmanager
def _busy(count: int):
    import multiprocessing
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()


def _spin() -> None:
    while True:
        pass


def _line(result: Result) -> str:
    shape = "dynamic batch" if result.batch is None else f"batch {result.batch}"
    if result.error:
        return f"  {result.configuration:22s} {shape:14s} FAILED: {result.error}"
    cells = "  ".join(f"{k}: {v:6.1f}/s" for k, v in result.images_per_s.items())
    compile_s = f"compile {result.compile_s:5.1f} s" if result.compile_s is not None else " " * 15
    error = f"max abs {result.max_abs:.1e}" if result.max_abs is not None else ""
    return f"  {result.configuration:22s} {shape:14s} {compile_s}  {cells}  {error}  {result.code}"


def markdown(report: dict) -> str:
    keys = [f"{t}x{b}" for t in report["threads"] for b in report["batches"]]
    head = " | ".join(f"{k.split('x')[0]} thr, batch {k.split('x')[1]}" for k in keys)
    busy = (f"; {report['busy_cores']} other process(es) spinning on the CPU while timing (--busy-cores)"
            if report.get("busy_cores") else "")
    lines = [f"# AOTInductor on the CPU: {report['model']}", "",
             f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, torch "
             f"{report['machine']['torch']} (ISA {report['machine']['torch_cpu_capability']}). Images/s, median of "
             f"≥{REPEATS} runs after {WARMUP} warm-up, random input at the model's size; one run"
             f"{busy}.", "",
             f"| configuration | batch compiled | compile s | max abs vs eager | {head} | generated code |",
             "|---|---|---|---|" + "---|" * len(keys) + "---|"]
    for row in report["baselines"] + report["results"]:
        batch = "dynamic" if row["batch"] is None else str(row["batch"])
        if row["error"]:
            lines.append(f"| {row['configuration']} | {batch} | failed: {row['error']} |")
            continue
        cells = " | ".join(f"{row['images_per_s'][k]:.1f}" if k in row["images_per_s"] else "" for k in keys)
        error = "" if row["max_abs"] is None else f"{row['max_abs']:.1e}"
        lines.append(f"| {row['configuration']} | {batch} | {row['compile_s'] or ''} | {error} | {cells} | "
                     f"{row['code']} |")
    lines += ["", "Equal generated code (Inductor's hashes of the wrapper and kernel sources) means the same "
              "program: their difference in speed is this run's noise.", "", "Configurations:"] + [f"- **{n}** `{c['inductor']}`: {c['what']}"
                                        for n, c in report["configurations"].items()]
    return "\n".join(lines) + "\n"


def chart(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in report["baselines"] + report["results"] if not r["error"]]
    keys = [f"{t}x{b}" for t in report["threads"] for b in report["batches"]]
    figure, axis = plt.subplots(figsize=(max(8, 1.1 * len(rows)), 4.5))
    width = 0.8 / len(keys)
    names = [r["configuration"] + ("" if r["batch"] is None else f"\n(b{r['batch']})") for r in rows]
    for i, key in enumerate(keys):
        axis.bar([x + i * width for x in range(len(rows))], [r["images_per_s"].get(key, 0) for r in rows], width,
                 label=f"{key.split('x')[0]} thread(s), batch {key.split('x')[1]}")
    axis.set_xticks([x + width * (len(keys) - 1) / 2 for x in range(len(rows))], names, rotation=30, ha="right",
                    fontsize=8)
    axis.set_ylabel("images / second")
    axis.legend(fontsize=8)
    axis.grid(axis="y", alpha=0.3)
    axis.set_title(f"AOTInductor options on the CPU, {report['model']} ({report['machine']['cpu']}, one run)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def tuning_command(args) -> int:
    import os

    import models
    from measure.inprocess.records import parse_batches, parse_threads
    names = [n.strip() for n in args.configurations.split(",")]
    unknown = set(names) - {c.name for c in CONFIGURATIONS}
    if unknown:
        from export.errors import ExportError
        raise ExportError(f"unknown configuration(s) {', '.join(sorted(unknown))}; choose from "
                          f"{', '.join(c.name for c in CONFIGURATIONS)}")
    batches, threads = parse_batches(args.batches), parse_threads(args.threads, len(os.sched_getaffinity(0)))
    report = run(models.get(args.model), names, batches, threads, busy_cores=args.busy_cores)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "aoti-tuning.md", markdown(report))
    atomic_write_text(args.out / "aoti-tuning.json", json.dumps(report, indent=2))
    chart(report, args.out / "aoti-tuning.png")
    print("\n" + markdown(report))
    print(f"wrote {args.out}/aoti-tuning.md, .json and .png")
    return 0
