"""`python -m serving batch PATH INPUT --out OUT`: every photo of INPUT scored by the export's served form through
the endpoint's request core, one Parquet row per photo (serving/batch/output.py: SCHEMA): on one machine a process
pool, with --address on a Ray cluster through Ray Data.

  python -m serving batch artifacts/resnet50 photos/ --out scores/            # this machine: a process pool, no Ray
  python -m serving batch model-store/resnet50.mar 'photos/**/*.jpg' --out scores/ --address HEAD:6379
  python -m serving batch artifacts/resnet50 photos.parquet --column path --id-column photo_id --out scores/

PATH: an export folder or an archive (.mar); INPUT: a folder, a glob, or a .parquet/.csv table with a column of
paths or bytes (serving/batch/inputs.py). On this machine alone (no --address, CPUs) the serving policy's workers
run as a process pool, each reading, decoding and answering its photos as the endpoint's workers do
(serving/batch/local.py). With --address the model runs in a Ray Data actor pool sized by the serving policy
(contract/policy.py, the cluster's CPUs and GPUs as the machine; --workers/--threads/--batch-size as for `python -m
serving`); on CPUs, stateless Ray Data tasks read, decode and preprocess the photos before it with the core's
own first half (serving/batch/decoding.py), on a GPU each actor decodes its own. A photo the endpoint would
refuse gets a row with the endpoint's status and message; --fail-on-error makes the run end non-zero when any did.
Run again with the same command after a stop or a crash: the parts already written are kept, the rest scored.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import zipfile
from collections.abc import Iterable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from contract.cli import run_command
from contract.policy import Machine, PolicyChoices, ServingPolicy, add_policy_options, resolve_policy
from contract.records import MANIFEST_NAME, Manifest
from contract.versions import label_of
from handlers.core import STAGES
from handlers.opening import device_of
from serving.batch.decoding import decode_batch
from serving.batch.inputs import SHARD_SIZE, Photo, Shard, names_hash, photo_items, read_inputs, shards
from serving.batch.output import SCHEMA, RunRecord, fsync_folder, prepare_out, write_part
from serving.batch.progress import Progress
from serving.batch.scoring import handler_settings
from serving.batch.summary import BatchError, Tally, summary
from serving.settings import archive_pins

PROG = "python -m serving batch"
ROWS_PER_CALL = 16  # photos Ray Data hands an actor per call (at most a part's): amortises its per-call cost
RAY_START_TRIES = 3  # a loaded machine can miss Ray's own start-up deadline (its raylet's 30 s)
PASSED_TO_WORKERS = ("VISION_EXPORT_FORM_CHOICE", "OMP_WAIT_POLICY")  # the driver's settings the actors follow
logger = logging.getLogger("serving.batch")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("path", type=Path, help="an export folder or an archive (.mar)")
    parser.add_argument("input", help="a folder of photos, a glob, or a .parquet/.csv table")
    parser.add_argument("--out", type=Path, required=True, help="the folder of Parquet parts (created; resumed)")
    parser.add_argument("--column", help="the table's column of paths or bytes (default: path, image or bytes)")
    parser.add_argument(
        "--id-column", help="the table's column naming each photo in the output (default: its path, else TABLE#ROW)"
    )
    parser.add_argument(
        "--allow-outside-paths",
        action="store_true",
        help="read a table's paths that lead outside the table's folder (by '..', an absolute path or a link); "
        "default: each such row is an error row, its file unread",
    )
    parser.add_argument(
        "--address",
        help="a Ray cluster to run on with Ray Data (HEAD:PORT, auto, or local: a Ray of this machine's own); "
        "default: this machine's CPUs without Ray (a GPU machine: a Ray of its own)",
    )
    parser.add_argument(
        "--fail-on-error",
        action="store_true",
        help="exit 1 when any photo got an error row (default: 0 once every photo has its row)",
    )
    parser.add_argument(
        "--part-size",
        type=int,
        default=SHARD_SIZE,
        help=f"photos per Parquet part, the most a killed run scores again (default: {SHARD_SIZE})",
    )
    add_policy_options(parser, ("workers", "batch_size", "threads_per_worker"))
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run_command(
        lambda: score(args),
        interrupted="interrupted: the parts written are kept; run the same command again to score the rest",
    )


def score(args: argparse.Namespace) -> int:
    if not args.path.exists():
        raise BatchError(f"{args.path}: no such export folder or archive; export one with `python -m export`")
    manifest = read_manifest(args.path)
    photos = read_inputs(args.input, args.column, args.id_column, args.allow_outside_paths)
    if args.part_size < 1:
        raise BatchError(f"--part-size must be at least 1, got {args.part_size}")
    every_shard = shards(photos, args.part_size)
    record = run_record(manifest, photos, args)
    written = prepare_out(args.out, record)
    pending = [shard for shard in every_shard if shard.key not in written]
    logger.info(
        "%d photos in %d parts; %d written already, %d to score into %s",
        len(photos),
        len(every_shard),
        len(every_shard) - len(pending),
        sum(len(s.photos) for s in pending),
        args.out,
    )
    tally = (run_on_ray(args, pending) if args.address else run_here(args, pending)) if pending else Tally()
    return summary(args.out, record, tally, args.fail_on_error)


def run_record(manifest: Manifest, photos: list[Photo], args: argparse.Namespace) -> RunRecord:
    """What OUT records of this run: its photos, its part size and the model version that scores them."""
    from export.package.archive import content_hash

    version = manifest.model_version
    return RunRecord(
        names_hash(photo.input for photo in photos),
        len(photos),
        args.part_size,
        manifest.model.name,
        args.input,
        label_of(version),
        version.content if version else content_hash(manifest),
    )


def read_manifest(path: Path) -> Manifest:
    if path.is_dir():
        return Manifest.read(path)
    try:
        with zipfile.ZipFile(path) as members:
            return Manifest.from_json(members.read(MANIFEST_NAME).decode(), f"{path}:{MANIFEST_NAME}")
    except (zipfile.BadZipFile, KeyError):
        raise BatchError(
            f"{path} is not an archive with a {MANIFEST_NAME}; pass an export folder or a .mar "
            "that `python -m export` wrote"
        ) from None


def run_here(args: argparse.Namespace, pending: list[Shard]) -> Tally:
    """This machine alone: its CPUs' policy as a process pool (serving/batch/local.py); a GPU's through a Ray of
    its own, which gives each actor its device."""
    from handlers.policy import this_machine_resources
    from serving.batch.local import answered_locally

    started = time.monotonic()
    policy = resolve_policy(this_machine_resources(), pins_of(args.path), PolicyChoices.from_flags(args))
    if policy.device == "gpu":
        return run_on_ray(args, pending)
    logger.info("serving policy on this machine, without Ray: %s", policy.reason)
    scoring = time.monotonic()
    try:
        rows = answered_locally(args.path, pending, policy, min(ROWS_PER_CALL, args.part_size))
        tally = stream(args.out, pending, rows, scoring)
    except BrokenProcessPool:
        raise BatchError(
            "a worker process died (out of memory, or killed); the parts written are kept: run the same command "
            "again to score the rest"
        ) from None
    tally.start_s, tally.scoring_s, tally.workers = scoring - started, time.monotonic() - scoring, policy.workers
    return tally


def run_on_ray(args: argparse.Namespace, pending: list[Shard]) -> Tally:
    import ray

    started = time.monotonic()
    start_ray(args.address)
    try:
        policy = cluster_policy(args)
        logger.info("serving policy on the cluster's %s: %s", describe_cluster(), policy.reason)
        scoring = time.monotonic()
        answered = dataset(args.path, pending, policy, min(ROWS_PER_CALL, args.part_size))
        rows = (batch.to_pylist() for batch in answered.iter_batches(batch_size=None, batch_format="pyarrow"))
        tally = stream(args.out, pending, rows, scoring)
        tally.start_s, tally.scoring_s, tally.workers = scoring - started, time.monotonic() - scoring, policy.workers
        return tally
    finally:
        ray.shutdown()


def start_ray(address: str | None) -> None:
    import ray
    from ray.data import DataContext

    import serving.ray  # noqa: F401  (every Ray process of ours in one authentication mode)

    env = {name: os.environ[name] for name in PASSED_TO_WORKERS if name in os.environ}
    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            ray.init(
                address=address or "local",
                include_dashboard=False,
                logging_level=logging.WARNING,
                runtime_env={"env_vars": env} if env else None,
            )
            break
        except Exception as error:  # Ray raises a bare Exception when its node does not start in time
            ray.shutdown()
            if attempt == RAY_START_TRIES:
                raise BatchError(
                    f"Ray did not start ({error}); nothing was scored this time: run the same command again"
                ) from None
            logger.warning("Ray did not start (%s); starting it again", error)
    context = DataContext.get_current()
    context.enable_progress_bars = False  # ours (serving/batch/progress.py) counts photos, not blocks
    context.print_on_execution_start = False


def cluster_policy(args: argparse.Namespace) -> ServingPolicy:
    """The serving policy with the cluster as the machine (its CPUs and GPUs), the archive's pins, the flags."""
    import ray

    resources = ray.cluster_resources()
    machine = Machine(int(resources.get("GPU", 0)), int(resources.get("CPU", 1)))
    return resolve_policy(machine, pins_of(args.path), PolicyChoices.from_flags(args))


def pins_of(path: Path) -> PolicyChoices:
    """What the archive pins in its model-config.yaml (an export folder pins nothing)."""
    return archive_pins(path) if path.is_file() else PolicyChoices()


def describe_cluster() -> str:
    import ray

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    resources = ray.cluster_resources()
    return f"{len(nodes)} node(s), {int(resources.get('CPU', 0))} CPU(s), {int(resources.get('GPU', 0))} GPU(s)"


def dataset(model_path: Path, pending: list[Shard], policy: ServingPolicy, rows_per_call: int):
    """The pending photos as rows, answered by an actor pool of the policy's workers, each on its threads; where
    the cluster has CPUs beyond the actors', read, decoded and preprocessed before it by stateless tasks
    (serving/batch/decoding.py)."""
    import ray.data

    from serving.batch.scoring import Scorer

    items = photo_items(pending)
    # a block per call: answers stream back (parts written, progress shown) as each call ends
    rows = ray.data.from_items(items, override_num_blocks=max(1, -(-len(items) // rows_per_call)))
    on_gpu = policy.device == "gpu"
    if decodes_apart(policy):
        rows = rows.map_batches(decode_batch, batch_size=rows_per_call, batch_format="numpy", **decoding(model_path))
    return rows.map_batches(
        Scorer,
        batch_size=rows_per_call,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=policy.workers),
        num_cpus=policy.threads_per_worker,
        num_gpus=1 if on_gpu else 0,
        fn_constructor_kwargs={
            "model_path": str(model_path.absolute()),
            "policy": policy.to_dict(),
            "device": device_of(policy.device),
        },
    )


def decodes_apart(policy: ServingPolicy) -> bool:
    """Decode tasks only where the cluster has CPUs the actors leave free: where the actors hold them all, tasks
    would take their CPU time and add their processes and transfers (measured: two one-core nodes ran slower with
    them than one); on a GPU the actor decodes, as the endpoint's worker does (nvJPEG where allowed)."""
    import ray

    cpus = int(ray.cluster_resources().get("CPU", 1))
    return policy.device != "gpu" and cpus > policy.workers * policy.threads_per_worker


def decoding(model_path: Path) -> dict:
    """How the decode tasks run: at most one per CPU of the cluster, reserving none of Ray's CPUs (the policy
    gives them all to the actors), so they run on whatever CPU time the actors leave: before the actors are up,
    on the cores of any CPU the policy left over, between inferences. Ray Data's backpressure stops them when
    decoded photos wait for the actors."""
    import ray
    import ray.data

    settings = handler_settings(model_path)
    return {
        "compute": ray.data.TaskPoolStrategy(size=max(1, int(ray.cluster_resources().get("CPU", 1)))),
        "num_cpus": 0,
        "scheduling_strategy": "SPREAD",  # over every node: a task reserving no CPU would stay on the driver's
        "fn_kwargs": {
            "manifest_json": read_manifest(model_path).to_json(),
            "settings_json": json.dumps(settings) if settings is not None else None,
        },
    }


def stream(out: Path, pending: list[Shard], answered: Iterable[list[dict]], started: float) -> Tally:
    """The answered rows, a call's at a time, gathered per shard; each shard written as its part once all its rows
    are in."""
    sizes = {shard.key: len(shard.photos) for shard in pending}
    waiting: dict[str, list[dict]] = {}
    tally = Tally()
    progress = Progress(sum(sizes.values()))
    columns = SCHEMA.names
    for batch in answered:
        if not tally.first_rows:
            tally.first_answer_s, tally.first_rows = time.monotonic() - started, len(batch)
        for row in batch:
            for stage in STAGES:
                tally.stage_ms[stage] += row[f"{stage}_ms"]
            tally.decoders.add(row["decoder"])
            rows = waiting.setdefault(row["shard"], [])
            rows.append({name: row[name] for name in columns})
            if len(rows) == sizes[row["shard"]]:
                failed = sum(1 for r in rows if r["status"] != 200)
                write_part(out, row["shard"], waiting.pop(row["shard"]))
                tally.rows, tally.failed = tally.rows + len(rows), tally.failed + failed
                logger.info("part %s written: %d rows, %d failed", row["shard"], len(rows), failed)
        progress.update(tally.rows + sum(len(rows) for rows in waiting.values()), tally.failed)
    progress.close()
    fsync_folder(out)
    if waiting:
        raise BatchError(f"{len(waiting)} part(s) got fewer rows than photos; run the same command again")
    return tally


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
