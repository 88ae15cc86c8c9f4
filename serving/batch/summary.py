"""The end of a batch run: what it scored (Tally, filled by run.py as parts are written) and its summary, which
checks that OUT holds exactly one row per photo and says the counts, the rate and where the time went."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from contract.errors import EXIT_ERROR, VisionExportError
from handlers.core import STAGES
from serving.batch.decoding import PREPARED_STAGES
from serving.batch.output import RunRecord, read_rows


class BatchError(VisionExportError):
    """The run cannot start or did not score every photo; the message says why."""


@dataclass
class Tally:
    """What the run scored: rows written, failed, each stage's total ms (the core's timings)."""

    rows: int = 0
    failed: int = 0
    start_s: float = 0.0  # Ray started (where it runs) and the policy resolved, before the first photo
    scoring_s: float = 0.0  # from the dataset's start to its last part written: the rate's time
    first_answer_s: float = 0.0  # from the scoring's start to the first answers (the workers loading the model)
    first_rows: int = 0  # photos in that first batch of answers
    workers: int = 1  # the model's workers (actors, or the local pool's processes)
    stage_ms: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    decoders: set = field(default_factory=set)  # node:pid of each decode task ("": the model's workers decoded)


def summary(out: Path, record: RunRecord, tally: Tally, fail_on_error: bool) -> int:
    """Every photo has exactly one row (else an error); the counts, the rate and where the time went."""
    table = read_rows(out)
    names = table.column("input").to_pylist()
    if len(names) != record.photos or len(set(names)) != record.photos:
        raise BatchError(
            f"{out} holds {len(names)} rows ({len(set(names))} photos) for {record.photos} "
            "photos; run the same command again to score the missing ones"
        )
    statuses = table.column("status").to_pylist()
    failed = sum(1 for status in statuses if status != 200)
    rate = tally.rows / tally.scoring_s if tally.rows and tally.scoring_s else 0.0
    steady_s = tally.scoring_s - tally.first_answer_s
    steady = (tally.rows - tally.first_rows) / steady_s if tally.rows > tally.first_rows and steady_s > 0 else rate
    per_photo = {stage: ms / tally.rows for stage, ms in tally.stage_ms.items()} if tally.rows else {}
    spread = decoding_spread(tally)
    in_actors = sum(ms for s, ms in tally.stage_ms.items() if s not in PREPARED_STAGES or not spread["tasks"])
    in_core = in_actors / 1000 / (tally.scoring_s * tally.workers) if tally.scoring_s else 0.0
    lines = [
        f"done: {record.photos} photos, {record.photos - failed} answered, {failed} error rows, in {out}",
        f"this run: {tally.rows} photos in {tally.scoring_s:.1f} s, {rate:.1f} photos/s; {steady:.1f} photos/s "
        f"after the first answers ({tally.first_answer_s:.1f} s: the workers loading the model); the start "
        f"before it: {tally.start_s:.1f} s"
        + (" (the rest were written by an earlier run)" if tally.rows < record.photos else ""),
    ]
    if per_photo:
        lines.append(
            "per photo: "
            + ", ".join(f"{s} {ms:.1f} ms" for s, ms in per_photo.items())
            + f"; the {tally.workers} worker(s) spent {100 * in_core:.0f} % of the run's time in the core's "
            + ("second half (inference, encode)" if spread["tasks"] else "stages")
        )
        lines.append(
            f"decoding: {spread['tasks']} task process(es) on {spread['nodes']} node(s), {spread['cpus']:.2f} CPU(s) "
            f"busy on average, {spread['photos_per_cpu_s']:.1f} photos/s per busy CPU"
            if spread["tasks"]
            else "decoding: in the model's workers, as the endpoint's workers decode"
        )
    if failed:
        lines.append(f"error rows: status != 200, e.g. {first_error(table)}")
    print("\n".join(lines), flush=True)
    print(
        json.dumps(
            {
                "photos": record.photos,
                "failed": failed,
                "scored_now": tally.rows,
                "start_s": round(tally.start_s, 2),
                "scoring_s": round(tally.scoring_s, 2),
                "photos_per_s": round(rate, 2),
                "first_answer_s": round(tally.first_answer_s, 2),
                "photos_per_s_after_first_answers": round(steady, 2),
                "workers": tally.workers,
                "share_of_actor_time_in_core": round(in_core, 3),
                "stage_ms_per_photo": {s: round(ms, 2) for s, ms in per_photo.items()},
                "decoding": spread,
            }
        ),
        flush=True,
    )
    return EXIT_ERROR if failed and fail_on_error else 0


def decoding_spread(tally: Tally) -> dict:
    """How decoding was spread: its task processes and nodes, the CPUs it kept busy on average over the scoring
    time, and its rate per busy CPU (decode and preprocess, as the tasks timed them)."""
    processes = {name for name in tally.decoders if name}
    busy_s = sum(tally.stage_ms[stage] for stage in PREPARED_STAGES) / 1000
    return {
        "tasks": len(processes),
        "nodes": len({name.split(":")[0] for name in processes}),
        "cpus": round(busy_s / tally.scoring_s, 3) if processes and tally.scoring_s else 0.0,
        "photos_per_cpu_s": round(tally.rows / busy_s, 2) if processes and busy_s else 0.0,
    }


def first_error(table) -> str:
    for name, status, error in zip(*(table.column(c).to_pylist() for c in ("input", "status", "error"))):
        if status != 200:
            return f"{name}: {status} {error}"
    return ""
