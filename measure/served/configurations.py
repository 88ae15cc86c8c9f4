"""What the serving benchmark serves: one Configuration per row family, and the naive baseline (the traced
TorchScript behind measure/served/naive_handler.py, a handler written as TorchServe's documentation teaches,
with TorchServe's own defaults)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from contract.records import CLASSIFICATION, Manifest
from export.package.archive import archive_files
from handlers.policy import ServingPolicy
from serving.torchserve.config import INFERENCE_PORT, MANAGEMENT_PORT, METRICS_PORT

CORES = os.cpu_count() or 1
NAIVE = "naive"
DEFAULT = "default"
INT8 = "int8"
LITSERVE = "litserve"  # the peer: not TorchServe (bench_peer.py, peer_litserve.py)
KSERVE = "kserve"  # our core in KServe's own ModelServer (serving/kserve/), not TorchServe
RAY = "ray"  # our core as a Ray Serve deployment (serving/ray/), behind Serve's HTTP proxy
OPTIONAL_ENGINES = {RAY: "ray"}  # configurations whose engine is an optional extra (pip extra, module): its module
NAIVE_HANDLER = Path(__file__).resolve().parent / "naive_handler.py"
NAIVE_ARTIFACT = "traced"
# TorchServe's own defaults for a CPU host (ConfigManager.getDefaultWorkers: a worker per processor when
# there is no GPU; batchSize 1, maxBatchDelay 100); the naive handler ignores our thread setting, so torch
# in each worker uses its default intra-op threads (every physical core).
TORCHSERVE_DEFAULT_BATCH_DELAY_MS = 100


@dataclass(frozen=True)
class Configuration:
    description: str
    artifact: str | None = None  # None: the export's served artifact
    overrides: dict = field(default_factory=dict)  # pinned model-config keys (win over the serve-time policy)
    env: dict = field(default_factory=dict)  # extra environment for TorchServe and its workers
    speed_only_ungated: bool = False  # may serve a variant that failed its accuracy gate, labelled as such
    classifier_only: str = ""  # why a detector's or segmenter's export cannot have this row (empty: any task can)


CONFIGURATIONS = {
    NAIVE: Configuration("baseline: traced TorchScript, a handler as TorchServe's docs teach (PIL + torchvision "
                         "transforms), TorchServe's default workers (one per core), torch's default threads, "
                         "no batching", NAIVE_ARTIFACT,
                         classifier_only="its handler is TorchServe's documented image classifier (crop, top-k)"),
    DEFAULT: Configuration("the policy `python -m serving` decides for this machine, the export's served artifact"),
    INT8: Configuration("the default policy with the int8 ONNX (export --precision fp32,int8); when its "
                        "accuracy gate failed (random weights) it is served here for its speed only and the "
                        "row says so", "onnx-int8", speed_only_ungated=True),
    "openvino-int8": Configuration("the default policy with OpenVINO's int8 (NNCF; export --formats default,openvino "
                                   "--precision fp32,int8); when its accuracy gate failed it is served here for its "
                                   "speed only and the row says so", "openvino-int8", speed_only_ungated=True),
    "openvino-bf16": Configuration("the default policy with the OpenVINO IR under the bf16 hint (export --formats "
                                   "default,openvino --precision fp32,bf16, a CPU with avx512_bf16 or amx); speed only "
                                   "when its accuracy gate failed, and the row says so", "openvino-bf16",
                                   speed_only_ungated=True),
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
    "exact-decode": Configuration("the default with the handler setting decode: exact (every pixel decoded): "
                                  "the request path before draft decoding", None, {"decode": "exact"},
                                  classifier_only="a whole-image task decodes every pixel already (no draft "
                                                  "decode to turn off)"),
    LITSERVE: Configuration("the peer a user would pick instead: the export's served artifact and the same "
                            "preprocessing behind a minimal LitServe server (measure/served/peer_litserve.py: ONNX "
                            "Runtime with 1 intra-op thread, 2 workers), sent each image as a multipart form file",
                            classifier_only="the peer runs a classifier's crop and top-k"),
    KSERVE: Configuration("the second engine: the same archive and request core in KServe's own ModelServer "
                          "(python -m serving --engine kserve), the default policy's worker processes and threads, "
                          "sent each image as KServe's v1 JSON (base64 in instances)"),
    RAY: Configuration("the distributed engine: the same archive and request core as a Ray Serve deployment "
                       "(python -m serving --engine ray, a head node of its own), the default policy's replicas and "
                       "CPUs, behind Serve's HTTP proxy; sent each image raw, as to TorchServe"),
}

FORM_PREFIX = "form:"  # form:KIND, a row of the default policy serving that one of the export's servable forms


def configuration(name: str) -> Configuration:
    """The row family `name` names: one of CONFIGURATIONS, or form:KIND."""
    if name.startswith(FORM_PREFIX):
        kind = name[len(FORM_PREFIX):]
        return Configuration(f"the default policy serving the export's {kind} form alone", kind)
    return CONFIGURATIONS[name]


def known(name: str) -> bool:
    return name in CONFIGURATIONS or (name.startswith(FORM_PREFIX) and len(name) > len(FORM_PREFIX))


def default_names(manifest: Manifest) -> list[str]:
    """What --configurations runs when not given. A classifier: every configuration. A detector or segmenter:
    the served choice, each other form that passed parity on its own (the ceiling of each form served), and the
    other engines; the classifier's baseline, peer and decode rows have no meaning there."""
    if manifest.task == CLASSIFICATION:
        return list(CONFIGURATIONS)
    decision = manifest.decision()
    forms = [f"{FORM_PREFIX}{kind}" for kind in decision.servable if kind != decision.served]
    return [DEFAULT, *forms, KSERVE, RAY]


def task_refusals(names: list[str], manifest: Manifest) -> list[str]:
    """Why each of names cannot run on this export's task (empty: all can)."""
    if manifest.task == CLASSIFICATION:
        return []
    return [f"{name}: {configuration(name).classifier_only}" for name in names if configuration(name).classifier_only]


NAIVE_CONFIG = f"""# TorchServe with its defaults, on loopback only (the naive baseline of python -m measure bench)
inference_address=http://127.0.0.1:{INFERENCE_PORT}
management_address=http://127.0.0.1:{MANAGEMENT_PORT}
metrics_address=http://127.0.0.1:{METRICS_PORT}
grpc_inference_address=127.0.0.1
grpc_management_address=127.0.0.1
enable_envvars_config=true
disable_token_authorization=true
enable_model_api=false
# TorchServe's own JVM defaults and its own log4j2.xml (in its jar), not the ones `python -m serving` adds
vmargs=-Dlog4j.configurationFile=log4j2.xml
"""


def ceiling_of(name: str, manifest: Manifest) -> tuple[str, str, dict]:
    """(key, artifact kind, handler settings) of the request path a configuration's pipeline ceiling measures:
    its artifact, decoded as its handler settings say (a decode setting gets a ceiling of its own)."""
    kind = served_kind(name, manifest)
    settings = {k: v for k, v in configuration(name).overrides.items() if k == "decode"}
    return (f"{kind} (decode {settings['decode']})" if settings else kind), kind, settings


def served_kind(name: str, manifest: Manifest) -> str:
    """The artifact kind a configuration serves."""
    return configuration(name).artifact or manifest.decision().served_kind()


def ungated_verdict(name: str, manifest: Manifest) -> str | None:
    """'speed only, accuracy gate failed: ...' when this configuration serves a variant that failed its gate."""
    row = configuration(name)
    why_not = manifest.decision().candidates.get(row.artifact, "")
    if row.speed_only_ungated and why_not.startswith("accuracy gate"):
        print(f"  {name}: SPEED ONLY, NOT SERVABLE: {row.artifact} {why_not}", flush=True)
        return f"speed only, {why_not}"
    return None


def runnable(names: list[str], manifest: Manifest) -> list[str]:
    """The configurations whose artifact this export has and that are not the default row again; the others
    are named and skipped."""
    served = manifest.decision().served
    kept = []
    for name in names:
        artifact = configuration(name).artifact
        if artifact is not None and artifact not in manifest.artifacts:
            print(f"skipping {name}: this export has no {artifact} "
                  f"(python -m export ... --precision fp32,int8 adds onnx-int8)", flush=True)
        elif artifact == served and name != NAIVE and not configuration(name).overrides and DEFAULT in names:
            print(f"skipping {name}: the export serves {artifact} already, so it is the default row", flush=True)
        else:
            kept.append(name)
    return kept


def naive_policy() -> ServingPolicy:
    return ServingPolicy(CORES, 1, TORCHSERVE_DEFAULT_BATCH_DELAY_MS, CORES, "cpu",
                         "TorchServe's defaults: a worker per core, no batching (threads not tuned)")


def build_naive_archive(export_dir: Path, manifest: Manifest, store: Path) -> Path:
    """torch-model-archiver as its docs show: the traced .pt, the naive handler, the labels; NAME.mar after the
    model, like the export's own archive."""
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=store, prefix=".naive-extra-") as extra:
        if manifest.output.labels:
            shutil.copy2(export_dir / manifest.output.labels, Path(extra) / manifest.output.labels)
        return archive_files(manifest.model.name, export_dir / manifest.artifacts[NAIVE_ARTIFACT].path,
                             NAIVE_HANDLER, store, extra_files=Path(extra) if manifest.output.labels else None)
