"""The serving benchmark's pipeline ceilings: for each artifact a configuration serves and each body, the
request path of `python -m measure pipeline` (handlers.core's decode -> preprocess -> inference -> encode, in
one process) at one worker's thread budget of this machine's serving policy, times the policy's workers.
Measured in the same run as the served rows, so every served figure has the ceiling of its own body beside it.

The core (the export's task's: handlers/tasks.py) is set up as from_folder sets it up, with the configuration's artifact instead
of the export's decided one (the int8 and naive rows serve other kinds). `workers x per worker` is an upper
bound: the workers' threads never exceed the cores, but they share memory bandwidth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract.files import atomic_write_text
from contract.records import Manifest
from handlers.policy import ServingPolicy
from handlers.tasks import CORES
from measure.request_path import stages

DEFAULT_SECONDS = 3.0  # timed seconds per body and artifact (stages.py's default)


@dataclass(frozen=True)
class Ceilings:
    """images/s of the whole request path, per artifact kind and body name, at the policy's workers."""
    per_kind: dict  # {kind: {body name: stages.measure_body's row}}
    workers: int

    def of(self, kind: str, body: str) -> float | None:
        row = self.per_kind.get(kind, {}).get(body)
        return row["pipeline_images_per_s"] * self.workers if row else None

    def of_row(self, row: dict) -> float | None:
        """The ceiling of a served row: of its body, or for a mix of the composition of bodies it served (the
        rate at which the pipeline would do that many of each: total / sum(count / ceiling)); equal shares
        when nothing was answered."""
        composition = row["bodies"] if sum(row["bodies"].values()) else dict.fromkeys(row["bodies"], 1)
        ceilings = {body: self.of(row.get("ceiling", row["artifact"]), body) for body in composition}
        if not composition or None in ceilings.values():
            return None
        return sum(composition.values()) / sum(n / ceilings[body] for body, n in composition.items())


def measure(export_dir: Path, manifest: Manifest, wanted: list[tuple[str, str, dict]], files: list[Path],
            policy: ServingPolicy, seconds: float, device: str = "cpu") -> Ceilings:
    """`wanted`: (key, artifact kind, handler settings) per ceiling (bench_configurations.ceiling_of)."""
    per_kind = {}
    for key, kind, settings in {key: (key, kind, settings) for key, kind, settings in wanted}.values():
        print(f"pipeline ceiling of {key} ({policy.threads_per_worker} thread(s) x {policy.workers} worker(s)):",
              flush=True)
        core = CORES[manifest.task].from_folder(export_dir, device, settings, threads=policy.threads_per_worker,
                                                kind=kind)
        per_kind[key] = {}
        for path in files:
            row = stages.measure_body(core, path, policy.batch_size, seconds)
            per_kind[key][path.name] = row
            print(f"  {path.name:<20} {row['pipeline_images_per_s']:7.1f} images/s per worker "
                  f"(model alone {row['model_images_per_s']:.1f})", flush=True)
    return Ceilings(per_kind, policy.workers)


def write(ceilings: Ceilings, manifest: Manifest, policy: ServingPolicy, cores: int, out: Path) -> None:
    """pipeline.md (one table per artifact, stages.py's form) and pipeline.json beside the served results."""
    sections, data = [], {}
    for kind, rows in ceilings.per_kind.items():
        context = {"model": manifest.model.name, "artifact": kind, "threads": policy.threads_per_worker,
                   "batch": policy.batch_size, "workers": policy.workers, "cores": cores}
        sections.append(stages.markdown(list(rows.values()), context))
        data[kind] = {"context": context, "rows": list(rows.values())}
    atomic_write_text(out / "pipeline.md", "\n".join(sections))
    atomic_write_text(out / "pipeline.json", json.dumps(data, indent=2) + "\n")
