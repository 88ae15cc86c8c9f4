"""Fuzz the request decoder: no input may make runtime.images.decode_image or preprocess raise anything but an
ImageError, and what they return must be a well-formed RGB image and model row.

Two engines, each in its own process so that a crash (or a hang, or a native fault) is reported with its input:

- `mutator`: fuzz_mutator's structure-aware edits of the seed corpus (fuzz_corpus), from a fixed seed and a
  fixed number of cases: the same inputs, so the same classes of bugs, on every machine.
- `atheris`: coverage-guided (libFuzzer through atheris, PIL's Python code instrumented), seeded, for a time;
  it mutates with libFuzzer's own mutations and fuzz_mutator's, half and half.

    python -m tests.runtime.fuzz_decoder --seconds 600 --out fuzz-results     # longer than CI, both engines

Each engine keeps going after a failure: the first input of each failure class (exception type and the line
that raised it) is saved as OUT/ENGINE/unexpected-<Type>-<file>-<line>.bin with its traceback beside it
(.txt); libFuzzer's own findings (crash-*, timeout-*, oom-*) land there too. Exit status 1 when anything was
found. DECODE_FUZZ_SECONDS sets the CI test's budget (tests/runtime/test_decode_fuzz.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The mutator's case count per second of budget: fixed, so a budget means the same inputs; below what one core
# runs while atheris has the other, so the mutator ends within the budget.
CASES_PER_SECOND = 500
STATS_EVERY = 500  # inputs between two writes of an engine's stats file
FINDINGS = ("unexpected-*.bin", "crash-*", "timeout-*", "oom-*", "leak-*")
CROP = (16, 16)
ENGINE_THREADS = 1  # torch threads per engine: the engines share the cores, and a CPU worker here runs 1 (with
# more, the two engines' torch thread pools wait on each other and each runs far fewer inputs a second)
PER_INPUT_TIMEOUT_S = 30  # libFuzzer reports an input that takes longer as a hang (timeout-*)


@dataclass
class Stats:
    engine: str
    inputs: int = 0
    seconds: float = 0.0
    image_errors: Counter = field(default_factory=Counter)  # ImageProblem's value -> how many inputs got it
    pil_unexpected: Counter = field(default_factory=Counter)  # "TypeError at file:line" refused as corrupt, logged
    failures: dict = field(default_factory=dict)  # failure class -> saved input file


class Recorder(logging.Handler):
    """Runs one input through the decoder, counts outcomes, saves the first input of each failure class."""

    def __init__(self, engine: str, out: Path):
        super().__init__(logging.WARNING)
        from contract.records import ImageContract
        self.contract = ImageContract(resize=24, crop=CROP)
        self.out, self.started, self.current = out, time.monotonic(), b""
        self.stats = Stats(engine)
        out.mkdir(parents=True, exist_ok=True)
        logging.getLogger("runtime.images").addHandler(self)
        logging.getLogger("runtime.images").propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        """decode_image's warning for a PIL error outside PIL's docs (refused as corrupt): counted, first input
        kept."""
        key = record.getMessage().split(" on a corrupt image")[0].removeprefix("PIL raised ")
        if key not in self.stats.pil_unexpected:
            name, where = key.split(" at ")
            (self.out / f"handled-{name}-{Path(where).name.replace(':', '-')}.bin").write_bytes(self.current)
        self.stats.pil_unexpected[key] += 1

    def run(self, data: bytes) -> None:
        from runtime.images import ImageError
        self.stats.inputs += 1
        self.current = data
        try:
            check(data, self.contract)
        except ImageError as error:
            self.stats.image_errors[error.problem.value] += 1
        except Exception as error:  # the finding itself: recorded with its input and traceback
            self.save(data, error)
        if self.stats.inputs % STATS_EVERY == 0:
            self.write_stats()

    def save(self, data: bytes, error: Exception) -> None:
        name, where = type(error).__name__, traceback.extract_tb(error.__traceback__)[-1]
        key = f"{name} at {Path(where.filename).name}:{where.lineno}"
        if key in self.stats.failures:
            return
        path = self.out / f"unexpected-{name}-{Path(where.filename).stem}-{where.lineno}.bin"
        path.write_bytes(data)
        path.with_suffix(".txt").write_text("".join(traceback.format_exception(error)))
        self.stats.failures[key] = path.name
        self.write_stats()

    def write_stats(self) -> None:
        self.stats.seconds = round(time.monotonic() - self.started, 1)
        plain = {**vars(self.stats), "image_errors": dict(self.stats.image_errors),
                 "pil_unexpected": dict(self.stats.pil_unexpected)}  # (asdict would rebuild each Counter from pairs)
        (self.out / "stats.json").write_text(json.dumps(plain, indent=1) + "\n")


def check(data: bytes, contract) -> None:
    """The property fuzzed: an ImageError, or a uint8 (3, H, W) image within the limits and a [0, 1] row."""
    import torch

    from runtime.images import MAX_PIXELS, MAX_SIDE, MIN_SIDE, decode_image, preprocess
    image = decode_image(data)
    channels, height, width = image.shape
    within_limits = MIN_SIDE <= min(height, width) and max(height, width) <= MAX_SIDE and height * width <= MAX_PIXELS
    if image.dtype != torch.uint8 or channels != 3 or not within_limits:
        raise AssertionError(f"decode_image returned {image.dtype} {tuple(image.shape)}")
    row = preprocess(image, contract)
    if tuple(row.shape) != (3, *CROP) or not (row.min() >= 0 and row.max() <= 1):
        raise AssertionError(f"preprocess returned {tuple(row.shape)} in [{row.min()}, {row.max()}]")


# ---------------------------------------------------------------- the engines (each runs in its own process)
def run_mutator(out: Path, seed: int, cases: int) -> Stats:
    from tests.runtime.fuzz_corpus import seed_corpus
    from tests.runtime.fuzz_mutator import mutate
    recorder = Recorder("mutator", out)
    seeds = list(seed_corpus().values())
    in_flight = out / "in-flight.bin"  # the input being decoded, kept if the process dies on it
    with open(in_flight, "wb") as kept:
        for case in range(cases):
            data = mutate(seeds[case % len(seeds)], random.Random(f"{seed}:{case}"))
            os.pwrite(kept.fileno(), data, 0)  # (50x cheaper than reopening the file per case)
            os.ftruncate(kept.fileno(), len(data))
            recorder.run(data)
    in_flight.unlink()
    recorder.write_stats()
    return recorder.stats


def run_atheris(out: Path, seed: int, seconds: int) -> None:
    """Never returns: libFuzzer exits the process when the time is up (it prints "Done N runs in S second(s)")."""
    import atheris
    with atheris.instrument_imports(include=["PIL", "runtime"]):
        from PIL import Image
        Image.init()  # every plugin, imported (and instrumented) now
        import runtime.images  # noqa: F401
    from tests.runtime.fuzz_corpus import write_seed_corpus
    from tests.runtime.fuzz_mutator import mutate
    corpus = out / "corpus"
    write_seed_corpus(corpus)
    recorder = Recorder("atheris", out)

    def custom_mutator(data: bytes, max_size: int, mutation_seed: int) -> bytes:
        rng = random.Random(mutation_seed)
        return atheris.Mutate(data, max_size) if rng.random() < 0.5 or not data else mutate(data, rng, max_size)

    atheris.Setup([sys.argv[0], f"-seed={seed}", f"-max_total_time={seconds}", f"-timeout={PER_INPUT_TIMEOUT_S}",
                   f"-rss_limit_mb={RSS_LIMIT_MB}",
                   f"-artifact_prefix={out}/", "-print_final_stats=1", str(corpus)], recorder.run,
                  custom_mutator=custom_mutator)
    atheris.Fuzz()


# libFuzzer's default 2 GB RSS limit is below what the decoder may legitimately use: the largest image accepted
# (MAX_PIXELS) costs several bytes a pixel on the request path (measured: docs/results/2026-11-25-request-path-memory/), on top
# of this process's torch and PIL, and the allocator keeps freed pages: libFuzzer counts the whole process's peak,
# which grows over a run of mutated headers within the limits (CI went past 2 GB, later past 4 GB, on inputs that
# alone peak under 1 GB). 8 GB still catches a decoder that grows without bound.
RSS_LIMIT_MB = 8192


# ---------------------------------------------------------------- the parent: both engines, one report
@dataclass
class Report:
    engines: dict  # engine -> its stats (inputs, seconds, outcomes, failures)
    findings: list[Path]  # every saved failing input

    def lines(self) -> list[str]:
        rows = [f"{name}: {s['inputs']} inputs in {s['seconds']} s ({s['inputs'] / max(s['seconds'], 1e-9):.0f}/s), "
                f"image errors {dict(s['image_errors'])}, PIL errors outside its docs {dict(s['pil_unexpected'])}"
                for name, s in self.engines.items()]
        return rows + [f"FOUND {path}" for path in self.findings]


def fuzz(out: Path, seconds: int, seed: int = 1, engines: tuple[str, ...] = ("mutator", "atheris")) -> Report:
    """Both engines at once, each in a child process (one core each); returns what they ran and found."""
    children = {engine: start_engine(engine, out / engine, seconds, seed) for engine in engines}
    for engine, child in children.items():
        try:
            child.wait(timeout=seconds * 3 + 120)
        except subprocess.TimeoutExpired:  # reported as a finding below: the engine's own log says where
            child.kill()
            child.wait()
            (out / engine / "timeout-engine.log").write_text(f"{engine} did not finish in {seconds * 3 + 120} s\n")
    return Report({engine: read_stats(out / engine, child.returncode) for engine, child in children.items()},
                  sorted(p for engine in engines for pattern in FINDINGS for p in (out / engine).glob(pattern)))


def start_engine(engine: str, out: Path, seconds: int, seed: int) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tests.runtime.fuzz_decoder", "--engine", engine, "--seconds", str(seconds),
               "--seed", str(seed), "--out", str(out)]
    with open(out / "engine.log", "wb") as log:
        return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def read_stats(out: Path, returncode: int) -> dict:
    written = out / "stats.json"
    stats = json.loads(written.read_text()) if written.exists() else {"inputs": 0, "seconds": 0}
    log = (out / "engine.log").read_text(errors="replace")
    done = re.findall(r"^Done (\d+) runs in (\d+) second", log, re.MULTILINE)
    if done:  # libFuzzer's own count is final; the stats file is written every STATS_EVERY inputs
        stats["inputs"], stats["seconds"] = int(done[-1][0]), float(done[-1][1])
    if returncode not in (0, None) and not stats.get("failures"):
        (out / "crash-engine.log").write_text(f"exit status {returncode}; last lines:\n" + log[-4000:])
    return {"image_errors": {}, "pil_unexpected": {}, **stats, "returncode": returncode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=600, help="atheris' time; the mutator runs "
                        f"{CASES_PER_SECOND} cases per second of it (default 600)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("fuzz-results"))
    parser.add_argument("--engine", choices=("mutator", "atheris"), help="run one engine in this process")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # PIL warns about odd metadata on most mutated inputs
    if args.engine:
        import torch
        torch.set_num_threads(ENGINE_THREADS)
    if args.engine == "mutator":
        return 1 if run_mutator(args.out, args.seed, args.seconds * CASES_PER_SECOND).failures else 0
    if args.engine == "atheris":
        run_atheris(args.out, args.seed, args.seconds)
        return 0  # (not reached: libFuzzer ends the process)
    report = fuzz(args.out, args.seconds, args.seed)
    print("\n".join(report.lines()))
    return 1 if report.findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
