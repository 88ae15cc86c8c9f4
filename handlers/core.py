"""The request's life, apart from any serving engine: set-up from a model folder, then for each batch
decode -> preprocess -> batch -> predict -> encode, with every row's error kept with its row.

LitServe's LitAPI is the model (setup, decode_request, preprocess, batch, predict, encode_response). The
TorchServe adapter (handlers/image_classifier.py) maps TorchServe's context onto this class; another engine
(KServe's ModelServer, Ray Serve) or a test runs the same class in-process:

    core = ImageCore.from_folder("artifacts/resnet50")   # an export folder or an unpacked .mar
    core.answer(Path("examples/cat.jpg").read_bytes())             # the JSON the endpoint answers

Which forms may serve is decided at export (manifest.json's serving decision: its gated candidates); set-up
chooses the one this machine serves among them (runtime/form_choice.py), checks its sha256, and opens it through
runtime/ (the backends parity ran).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from contract.handler_config import HandlerConfig, read_labels
from contract.policy import PolicyChoices, ServingPolicy, resolve_policy
from contract.records import CLASSIFICATION, ArtifactRecord, ContractError, ImageContract, Manifest
from contract.versions import label_of
from handlers import metrics, signals
from handlers.policy import this_machine_resources
from handlers.request import ImageRequest
from handlers.request_body import image_of, requested_topk
from handlers.request_error import RequestError
from handlers.start_phases import StartPhases
from runtime import ArtifactRunError, IntegrityError, RunOptions, open_artifact, verify_artifact
from runtime.base import Backend
from runtime.form_choice import Choice, choose, forget, taken_backend
from runtime.gpu_decode import NvjpegDecoder
from runtime.images import ImageError, decode_upright, draft_floor, preprocess
from runtime.machine import MachineProfile, this_machine_profile

logger = logging.getLogger(__name__)

STAGES = ("decode", "preprocess", "inference", "encode")
REBUILD = "the archive was modified or truncated after export; rebuild it with `python -m export`"


class HandlerSetupError(ContractError):
    """The model folder cannot be served as it is; the worker refuses to start with this message."""


@dataclass
class StageTimes:
    ms: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    @contextmanager
    def measure(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.ms[stage] += (time.perf_counter() - start) * 1000

    def line(self, size: int) -> str:
        """The line `python -m measure bench` parses (STAGE_LINE in measure/): keep its form."""
        return f"batch of {size}: " + " ".join(f"{s}={self.ms[s]:.2f}ms" for s in STAGES)


@dataclass
class BatchResult:
    answers: list  # per row: the answer dict, or the RequestError of that row
    times: StageTimes


def input_row(image: bytes, contract: ImageContract) -> torch.Tensor:
    """Image bytes -> the model's input row (float32 (3, crop) in [0, 1]), decoded as the contract says;
    clients without the core use it too."""
    return preprocess(decode_upright(image, draft_floor(contract)), contract)


def in_process_policy(settings: dict | None, threads: int | None) -> ServingPolicy:
    """The policy of a core opened without an engine (a test, a measurement): this machine's, the archive's
    handler.threads pinned, else the caller's threads."""
    return resolve_policy(this_machine_resources(), PolicyChoices.pinned_in({"handler": settings}),
                          PolicyChoices(threads_per_worker=threads, why="the caller asks for it"))


def run_precision(record: ArtifactRecord, config: HandlerConfig, device: str) -> str:
    """How the backend runs the artifact: as recorded (bf16/fp16 variants); fp32 TorchScript may run under
    fp16 autocast on a GPU when handler.fp16 asks for it."""
    if record.run_precision != "fp32" or not config.fp16:
        return record.run_precision
    if torch.device(device).type != "cuda":
        logger.warning("handler.fp16 is set but this worker runs on %s: serving %s in fp32", device, record.kind)
        return "fp32"
    return "fp16"


class ImageCore:
    """A classifier's request: one row per image, resized and cropped as its weights were evaluated, batched; the
    answer is the top k classes. handlers/tasks.py holds the other tasks' cores, which change only the hooks."""

    TASK = CLASSIFICATION

    def __init__(self, manifest: Manifest, record: ArtifactRecord, backend: Backend, labels: dict[int, str],
                 config: HandlerConfig, device: str, threads: int, choice: Choice | None = None,
                 policy: ServingPolicy | None = None, served_name: str | None = None):
        self.manifest = manifest
        self.name = name_served(manifest, served_name)  # what answers, log lines and metric labels call it
        self.record = record
        self.backend = backend
        self.labels = labels
        self.config = config
        self.device = device
        self.threads = threads
        self.policy = policy  # the serving policy it runs under (from_folder); None: its caller chose the threads
        self.choice = choice  # how from_folder chose the record on this machine (None: the caller chose)
        self.phases: StartPhases | None = None  # how from_folder's start went; its first answer completes it
        self.version = label_of(manifest.model_version)  # every answer names it (contract/versions.py)
        self.contract = self.input_contract(manifest)
        self.draft_floor = self.decode_floor(config)  # None: every pixel decoded
        # On a GPU, JPEGs are decoded there (nvJPEG) where the export's decode check allowed draft: its pixels,
        # like draft's, are not the exact decode's. Elsewhere, or with decode: exact, on the CPU.
        self.gpu_decoder = (NvjpegDecoder(device, self.contract) if self.draft_floor and torch.device(device).type
                            == "cuda" else None)

    # ------------------------------------------------------------ what differs per task (handlers/tasks.py)
    @classmethod
    def check_task(cls, manifest: Manifest) -> None:
        """Refuse, before opening anything, an archive of another task or without the input this core sends."""
        if manifest.task != cls.TASK:
            raise HandlerSetupError(f"this archive is a {manifest.task} model ({manifest.model.name}); the "
                                    f"{cls.TASK} handler cannot serve it: serve it with `python -m serving`, which "
                                    "opens each archive with its task's handler")
        cls.input_contract(manifest)

    @staticmethod
    def input_contract(manifest: Manifest):
        return manifest.input.image_contract()

    def decode_floor(self, config: HandlerConfig) -> int | None:
        return draft_floor(self.contract, config.decode)

    def input_line(self) -> str:
        return f"resize {self.contract.resize}, crop {'x'.join(map(str, self.contract.crop))}"

    def request_options(self, request: ImageRequest):
        """What encode_response needs from the request: here its k."""
        return requested_topk(request, self.config.topk)

    # ------------------------------------------------------------ setup
    @classmethod
    def from_folder(cls, folder: str | Path, device: str = "cpu", settings: dict | None = None,
                    threads: int | None = None, machine: MachineProfile | None = None,
                    policy: ServingPolicy | None = None, measure: bool = False,
                    kind: str | None = None, form: str | None = None,
                    phases: StartPhases | None = None, served_name: str | None = None) -> "ImageCore":
        """Serve the form this machine chooses among the export's gated candidates (runtime.form_choice.choose;
        `machine`: a simulated profile, for tests), after checking its sha256. `settings` is model-config.yaml's
        handler section; `policy` the serving policy the engine resolved (its threads run the model); without
        one, in_process_policy (the archive's threads pin, else `threads`, else this machine's). `measure` (what
        the engines ask): among the candidates this machine meets, the first of the declared order within a
        margin of the fastest, measured under the policy; without it, the first candidate this machine meets.
        `form`: that gated form, refused unless this machine may serve it (a test re-running the form a server
        named in its answer); `kind`: any artifact the manifest records, gated or not (a benchmark's row).
        `phases`: where the start's phases are timed (handlers/start_phases.py; begun here without one).
        `served_name`: the name the engine serves it under (name_served)."""
        folder, phases = Path(folder), phases or StartPhases.begin()
        with phases.timed("archive"):
            manifest = Manifest.read(folder)
        machine = machine or this_machine_profile(str(device))
        policy = policy or in_process_policy(settings, threads)
        with phases.timed("choice"):
            choice = None if kind else choose(folder, manifest, machine, policy.threads_per_worker,
                                              policy.batch_size, str(device), REBUILD, measure, form)
        record = manifest.artifacts[kind or choice.kind]
        with phases.timed("archive"):
            verified(folder, record, choice)
            cls.check_task(manifest)  # another task's archive, or one without an image contract, is refused here
            config = HandlerConfig.from_dict(settings)
            labels = labels_of(folder, manifest)
        threads = policy.threads_per_worker
        # torch's own pool runs the tensor work (softmax, a GPU decoder's resize) even when ONNX Runtime runs the
        # model; left at every core it competes with the other workers' inference, so it is pinned to the
        # worker's share (measured: docs/benchmarks.md).
        torch.set_num_threads(threads)
        precision = run_precision(record, config, device)
        with phases.timed("form_opened"):
            backend, warm = opened_backend(folder, record, RunOptions(device=str(device), threads=threads,
                                                                      precision=precision), choice)
        core = cls(manifest, record, backend, labels, config, str(device), threads, choice, policy, served_name)
        with phases.timed("warm_up"):
            if not warm:
                core.warm_up()
        core.phases = phases
        phases.opened(core.name, core.version)
        logger.info(choice.line() if choice else f"serving {kind}, the artifact the caller named")
        logger.info("serving policy: %s", policy.reason)
        logger.info("serving %s (%s: %s, sha256 verified) on %s with %d thread(s), %s; preprocessing: %s, decode %s",
                    core.name, manifest.model.name, record.kind, device, threads, precision, core.input_line(),
                    core.decode_mode())
        return core

    def warm_up(self) -> None:
        """A call of the form on a blank input at each batch size warm_up_sizes names, so that no client pays the
        runtime's first-call work. A failure is logged and the worker still starts: its requests are answered
        with the reason (predict), and readiness waits for a real answer anyway."""
        shape = self.manifest.input.handler_input()
        if shape is None:
            return
        try:
            for size in warm_up_sizes(self.device, self.policy.batch_size if self.policy else 1):
                self.backend(torch.zeros((size, *shape)))
        except ArtifactRunError as error:
            logger.error("warm-up of %s failed (its requests will say why): %s", self.record.kind, error)

    def describe(self) -> dict:
        """The model description engines show: what is served here, on which machine profile, and why; the
        serving policy it runs under, each value with its reason."""
        return {**self.names(), "version": self.version, "format": self.record.format,
                "precision": self.record.precision, "choice": self.choice.as_dict() if self.choice else None,
                "why": self.choice.line() if self.choice else "chosen by the caller, not by the machine rule",
                "backend": self.backend.describe(), "policy": self.policy.describe() if self.policy else None}

    def names(self) -> dict:
        """What every answer and the description name: the model as served, its architecture, the form serving."""
        return {"model": self.name, "architecture": self.manifest.model.name, "artifact": self.record.kind}

    @cached_property
    def served(self) -> metrics.ServedModel:
        """What its metrics and request lines name: model, version, form (handlers/metrics.py)."""
        return metrics.ServedModel.of(self.describe())

    # ------------------------------------------------------------ the request's life
    def decode(self, image: bytes) -> Image.Image:
        return decode_upright(image, self.draft_floor)

    def decode_mode(self) -> str:
        if self.gpu_decoder and self.gpu_decoder.available:
            return "nvJPEG on the GPU (CPU draft for other bodies)"
        return f"draft (JPEG sides kept >= {self.draft_floor})" if self.draft_floor else "exact"

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        """Resized and cropped on the CPU (torchvision.transforms.v2's uint8 kernel), then moved to the worker's device."""
        return preprocess(image, self.contract).to(self.device)

    @staticmethod
    def batch(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(rows)

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        """Probabilities per row. A runtime's failure arrives as ArtifactRunError (runtime.base.Backend)."""
        if self.config.simulate_hang_s:  # tests of the engine's response timeout only
            time.sleep(self.config.simulate_hang_s)
        return torch.softmax(self.backend(batch).float(), dim=1)

    def encode_response(self, probabilities: torch.Tensor, k: int) -> dict:
        values, indices = probabilities.topk(min(k, probabilities.numel()))
        return {
            "predictions": [{"label": self.labels.get(int(i), str(int(i))), "index": int(i),
                             "probability": round(float(p), 6)} for p, i in zip(values, indices)],
            **self.names(),
        }

    # ------------------------------------------------------------ a batch, row by row
    def run_batch(self, rows: Sequence[ImageRequest]) -> BatchResult:
        """Answer each request: one whose image or options cannot be read, or whose image cannot be decoded,
        gets its own RequestError, the others are answered."""
        times, start = StageTimes(), time.perf_counter()
        answers = self.answer_prepared(self.prepare_requests(rows, times), times)
        if self.phases and any(not isinstance(answer, RequestError) for answer in answers):
            self.phases.answered(time.perf_counter() - start)  # the start's last phase: its first real answer
        logger.info(times.line(len(rows)))
        signals.log_batch(self.served, list(zip(rows, answers)), times.ms)
        return BatchResult(answers, times)

    def prepare_requests(self, rows: Sequence[ImageRequest], times: StageTimes) -> list:
        """run_batch's first half, which needs no model (a batch run does it in tasks apart from the model's):
        each request's (input row, options), or its RequestError."""
        prepared: list = [None] * len(rows)
        requests: list[tuple[int, bytes, Any]] = []
        for index, request in enumerate(rows):
            try:
                requests.append((index, image_of(request), self.request_options(request)))
            except RequestError as error:
                prepared[index] = error
            except Exception as error:  # the request could not be read: our bug, not the client's
                prepared[index] = internal_error("reading", error)
        for (index, _, options), row in zip(requests, self.prepare([image for _, image, _ in requests], times)):
            prepared[index] = row if isinstance(row, RequestError) else (row, options)
        return prepared

    def answer_prepared(self, prepared: Sequence, times: StageTimes) -> list:
        """run_batch's second half: prepare_requests' rows predicted as one batch; each error kept with its row."""
        answers = [item if isinstance(item, RequestError) else None for item in prepared]
        ready = [(index, *item) for index, item in enumerate(prepared) if not isinstance(item, RequestError)]
        if ready:
            self._predict_into(answers, ready, times)
        return answers

    def prepare(self, images: list[bytes], times: StageTimes) -> list:
        """Each image's input row, or its RequestError: the GPU decoder's batch where there is one, else row by row."""
        prepare_one = lambda image: self._prepare_one(image, times)  # noqa: E731
        if self.gpu_decoder and images:
            return self.gpu_decoder(images, prepare_one, times.measure)
        return [prepare_one(image) for image in images]

    def _prepare_one(self, image: bytes, times: StageTimes):
        try:
            with times.measure("decode"):
                decoded = self.decode(image)
            with times.measure("preprocess"):
                return self.preprocess(decoded)
        except ImageError as error:
            return RequestError.for_image(error)
        except Exception as error:  # our bug, not the client's
            return internal_error("decoding", error)

    def _predict_into(self, answers: list, ready: list, times: StageTimes) -> None:
        try:
            with times.measure("inference"):
                probabilities = self.predict(self.batch([row for _, row, _ in ready]))
        except ArtifactRunError as error:  # the worker stays up; every request of the batch gets the reason
            logger.error("inference failed: %s\n%s", error, error.cause_traceback())
            for index, _, _ in ready:
                answers[index] = RequestError(500, f"inference failed: {error}")
            return
        with times.measure("encode"):
            for (index, _, options), row_output in zip(ready, probabilities):
                answers[index] = {**self.encode_response(row_output, options), "version": self.version}

    def answer(self, image_bytes: bytes, topk: int | None = None, **options) -> dict:
        """The JSON the endpoint returns for this image (`options`: the task's, e.g. score_threshold); a bad image
        raises its RequestError."""
        result = self.run_batch([ImageRequest.of_image(image_bytes, topk, **options)]).answers[0]
        if isinstance(result, RequestError):
            raise result
        return result


def name_served(manifest: Manifest, served_name: str | None) -> str:
    """The model's name in answers, log lines and metric labels: the name an engine serves it under (TorchServe's
    model name, KServe's, Ray's application's model: handlers/opening.py's open_archive hands it over), else, for
    a core opened without an engine (the batch, a test, a measurement), its architecture (manifest.model.name).
    The architecture is always a field of its own (ImageCore.names)."""
    return served_name or manifest.model.name


def internal_error(stage: str, error: Exception) -> RequestError:
    """A 500 for this row with the reason; logged with its traceback (called inside the except block)."""
    logger.exception("unexpected failure %s a request", stage)
    return RequestError(500, f"internal error while {stage}: {type(error).__name__}: {error}")


def verified(folder: Path, record: ArtifactRecord, choice: Choice | None) -> None:
    """The served form's sha256 checked before any of its code runs; a form chosen from an earlier start's
    measurement that fails it is forgotten there too (runtime/form_choice.py), so nothing stale is kept."""
    try:
        verify_artifact(folder, record, REBUILD)
    except IntegrityError:
        if choice is not None:
            forget(choice)
        raise


def warm_up_sizes(device: str, batch_size: int) -> range:
    """The batch sizes a worker warms up: on a GPU every size its batches may have, since cuDNN's autotuning and
    TorchScript's specialisation run again for each new shape, for each worker (docs/results/2026-11-28-gpu-check-h200);
    on a CPU batch 1, the only size its policy forms unless a flag says otherwise."""
    return range(1, (batch_size if str(device).startswith("cuda") else 1) + 1)


def opened_backend(folder: Path, record: ArtifactRecord, options: RunOptions,
                   choice: Choice | None) -> tuple[Backend, bool]:
    """(the form's backend, whether it has run already): the one the choice measured in this process when it ran
    under these options, else the form opened now."""
    kept = taken_backend(choice, options)
    if kept is not None:
        return kept, True
    return open_artifact(record.format, folder / record.path, options, name=record.kind), False


def labels_of(folder: Path, manifest: Manifest) -> dict[int, str]:
    name = manifest.labels_file()
    if not name:
        logger.warning("the manifest names no labels file: answers carry class indices as labels")
        return {}
    path = folder / name
    if not path.is_file():
        raise HandlerSetupError(f"the manifest names labels file {name} but {folder} has none; "
                                "rebuild the archive with `python -m export`")
    return read_labels(path)
