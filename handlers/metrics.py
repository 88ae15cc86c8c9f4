"""Every metric the engines expose, defined once (prometheus_client), with the same names and labels on TorchServe,
KServe and Ray: what the request core and the engine adapters record, and what each engine's metrics address
serves (docs/observability.md).

    vision_request_duration_seconds{model,version,form,code}   histogram: a request, arrival to answer
    vision_front_request_duration_seconds{model,code}          histogram: what the client waited, at the engine's front
    vision_stage_duration_seconds{model,version,form,stage}    histogram: decode, preprocess, queue, inference, encode
    vision_batch_size{model,version,form}                      histogram: rows per batch the model ran
    vision_requests_in_flight{model}                           gauge: requests arrived and not yet answered
    vision_request_failures_total{model,version,form,code}     counter: answers with a 4xx or 5xx code

No label takes unbounded values: model (the name it is served under, not its architecture: handlers/core.py's
name_served) and form come from the model store, version from the archive, code is an HTTP status, stage one of
STAGES (request ids are logged, never labels).

Where an engine answers from several processes (TorchServe's workers, KServe's worker pool, Ray's replicas) each
process writes its values to files in PROMETHEUS_MULTIPROC_DIR, which the engine sets before any of them starts
(prometheus_client reads it at import), and the engine's metrics address collects them all (registry()).
SIGNALS_ENV=off switches every metric and request id off (the cost measurement's "off" run).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as multiprocess_mode
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from contract.versions import UNVERSIONED  # the version label of an archive that records none

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own switch to multiprocess mode
SIGNALS_ENV = "VISION_SIGNALS"  # "off": no metrics recorded, no request ids made (measured cost: docs/observability.md)
CONTENT_TYPE = CONTENT_TYPE_LATEST
STAGES = ("decode", "preprocess", "queue", "inference", "encode")
UNKNOWN_MODEL = "unknown"  # the model label of a request naming no model served: a client's typo is no new series

# Buckets, in seconds, for this product's latencies: a request takes from a few ms (a small classifier on a GPU,
# Lite0 int8 on a CPU core) through tens of ms (ResNet-50 on two CPU cores) to seconds (a 12 MP photo through a
# detector). Geometric from 2.5 ms to 10 s at about x1.25-1.5 per step where CPU classifiers answer (10-400 ms),
# so a p99 computed from them by histogram_quantile lands within about a quarter of its value; coarser beyond.
LATENCY_BUCKETS = (0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1,
                   0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
# Stages are parts of a request: the same scale from 0.25 ms (an encode, a queue wait that did not wait).
STAGE_BUCKETS = (0.00025, 0.0005, 0.001) + LATENCY_BUCKETS
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # powers of two: the policy's batch sizes (contract/policy.py)

REQUEST_LABELS = ("model", "version", "form", "code")
BATCH_LABELS = ("model", "version", "form")

REQUEST_SECONDS = Histogram("vision_request_duration_seconds", "Time from a request's arrival to its answer",
                            REQUEST_LABELS, buckets=LATENCY_BUCKETS)
# The engine's front door (serving/front.py): TorchServe's Java frontend and Ray Serve's proxy queue a request before
# our code sees it, and record its whole time themselves; on KServe our middleware is the front. Model as served.
FRONT_SECONDS = Histogram("vision_front_request_duration_seconds",
                          "Time from a request's arrival at the engine's front door to its answer", ("model", "code"),
                          buckets=LATENCY_BUCKETS)
STAGE_SECONDS = Histogram("vision_stage_duration_seconds", "Time a batch spent in one stage of the request core",
                          (*BATCH_LABELS, "stage"), buckets=STAGE_BUCKETS)
BATCH_SIZE = Histogram("vision_batch_size", "Rows in each batch the model ran", BATCH_LABELS, buckets=BATCH_BUCKETS)
IN_FLIGHT = Gauge("vision_requests_in_flight", "Requests arrived and not yet answered", ("model",),
                  multiprocess_mode="livesum")
FAILURES = Counter("vision_request_failures", "Requests answered with a 4xx or 5xx code", REQUEST_LABELS)


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(SIGNALS_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


ON = enabled()


@dataclass(frozen=True)
class ServedModel:
    """The labels that name what served a request: the model as served, its archive's version and the form."""

    model: str
    version: str = UNVERSIONED
    form: str = "unknown"

    @classmethod
    def of(cls, description: Mapping) -> ServedModel:
        """From a core's describe() (or a worker pool's): model, artifact, and version when the archive has one."""
        return cls(str(description.get("model", "unknown")), str(description.get("version") or UNVERSIONED),
                   str(description.get("artifact", "unknown")))

    def labels(self) -> dict[str, str]:
        return {"model": self.model, "version": self.version, "form": self.form}


def observe_request(served: ServedModel, code: int, seconds: float) -> None:
    """One answered request: its latency under its code, and a failure when the code is 4xx or 5xx."""
    if not ON:
        return
    REQUEST_SECONDS.labels(**served.labels(), code=str(code)).observe(seconds)
    if code >= 400:
        FAILURES.labels(**served.labels(), code=str(code)).inc()


def observe_front(model: str, code: int, seconds: float) -> None:
    """One prediction as the engine's front door timed it (the name it is served under)."""
    if ON:
        FRONT_SECONDS.labels(model=model, code=str(code)).observe(seconds)


def observe_batch(served: ServedModel, rows: int, stage_ms: Mapping[str, float]) -> None:
    """One batch the core ran: its size and each stage's time (ms, as StageTimes holds them)."""
    if not ON:
        return
    BATCH_SIZE.labels(**served.labels()).observe(rows)
    for stage, ms in stage_ms.items():
        STAGE_SECONDS.labels(**served.labels(), stage=stage).observe(ms / 1000)


def observe_queue(served: ServedModel, seconds: float) -> None:
    """How long a request waited for a free worker (an engine that sees it: KServe's and Ray's batcher)."""
    if ON:
        STAGE_SECONDS.labels(**served.labels(), stage="queue").observe(seconds)


@contextmanager
def in_flight(model: str) -> Iterator[None]:
    if not ON:
        yield
        return
    gauge = IN_FLIGHT.labels(model=model)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


class Timer:
    """Seconds since it was made (a request's arrival)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.start


# ---------------------------------------------------------------- what a metrics address serves
MULTIPROC_DIR = os.environ.get(MULTIPROC_ENV)  # as prometheus_client read it at import: the mode is fixed then


def multiprocess_dir() -> Path | None:
    return Path(MULTIPROC_DIR) if MULTIPROC_DIR else None


def registry(folder: Path | None = None) -> CollectorRegistry:
    """The registry to expose: every process's values from the multiprocess folder (this process's, or `folder`
    where other processes write), or this process's own."""
    folder = folder or multiprocess_dir()
    if folder is None:
        from prometheus_client import REGISTRY
        return REGISTRY
    collected = CollectorRegistry()
    multiprocess_mode.MultiProcessCollector(collected, path=str(folder))
    if multiprocess_dir() is None:  # a process serving others' folder records the front itself (Ray's server)
        collected.register(FRONT_SECONDS)
    return collected


def exposition(folder: Path | None = None) -> bytes:
    """The Prometheus text format of registry(folder)."""
    return generate_latest(registry(folder))


def fresh_multiprocess_dir(folder: Path) -> Path:
    """An empty folder for a server's processes to write their values to (a previous run's files removed: their
    counters would add to this run's)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.db"):
        old.unlink()
    return folder


def process_exited(pid: int) -> None:
    """A worker process ended: its in-flight gauge no longer counts (counters and histograms keep its values)."""
    if multiprocess_dir() is not None:
        multiprocess_mode.mark_process_dead(pid)
