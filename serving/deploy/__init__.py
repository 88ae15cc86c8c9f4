"""`python -m serving deploy kserve|triton|ray OUT`: deployment material from an export (what other platforms
serve; the engines that serve here are `python -m serving --engine NAME`).

  python -m serving deploy kserve deploy/kserve [--export-dir artifacts/resnet50] [--model-store model-store]
  python -m serving deploy triton deploy/triton [--export-dir artifacts/resnet50] [--instance-kind gpu|cpu]
  python -m serving deploy ray deploy/ray [--export-dir artifacts/resnet50] [--model-store model-store]
      [--cluster-model-store /mnt/models/model-store] [--workers N] [--threads N]

The model's name (the archive NAME.mar, the Triton model, the InferenceService, the RayService) is the export's
(manifest.json -> model.name) unless --model-name says otherwise. See docs/scaling.md for when to use which
and how to apply what is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path, PurePosixPath

from contract.policy import PolicyChoices, add_policy_options
from contract.records import Manifest
from serving.deploy.common import DEFAULT_EXPORT_DIR
from serving.deploy.kserve import STORAGE_URI_PLACEHOLDER as KSERVE_URI
from serving.deploy.kserve import write_kserve
from serving.deploy.ray import CLAIM_NAME, CLUSTER_MODEL_STORE, storage_folder, write_ray
from serving.deploy.triton import STORAGE_URI_PLACEHOLDER as TRITON_URI
from serving.deploy.triton import write_triton

TARGETS = {"kserve": "KServe: storage layouts + InferenceServices for its TorchServe runtime and for our image "
                     "with the kserve engine",
           "triton": "a Triton model repository + an InferenceService for KServe's Triton runtime",
           "ray": "a KubeRay RayService (our image with Ray) + the storage folder and claim its pods read the "
                  "archive from"}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m serving deploy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    targets = parser.add_subparsers(dest="target", required=True)
    for name, help_text in TARGETS.items():
        sub = targets.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("out", type=Path, help="folder to write (must not exist, or be empty, unless --force)")
        sub.add_argument("--export-dir", type=Path, default=DEFAULT_EXPORT_DIR)
        sub.add_argument("--model-name", default=None, help="default: the export's model name (manifest model.name)")
        sub.add_argument("--force", action="store_true", help="replace OUT if it exists")
    targets.choices["kserve"].add_argument("--model-store", type=Path, default=Path("model-store"))
    targets.choices["kserve"].add_argument("--storage-uri", default=KSERVE_URI,
                                           help="where the storage folder will be ({model}, {device}, {version} "
                                                "are filled in)")
    targets.choices["kserve"].add_argument("--canary-percent", type=int, default=None, metavar="P",
                                           help="KServe's canaryTrafficPercent: applied over the running service, P %% "
                                                "of requests go to this version's revision (docs/rollout.md)")
    targets.choices["triton"].add_argument("--instance-kind", choices=("gpu", "cpu"), default="gpu")
    targets.choices["triton"].add_argument("--storage-uri", default=TRITON_URI)
    ray = targets.choices["ray"]
    ray.add_argument("--model-store", type=Path, default=Path("model-store"))
    ray.add_argument("--cluster-model-store", type=PurePosixPath, default=CLUSTER_MODEL_STORE,
                     help=f"where the pods read the archive (the claim's folder is mounted there; default: "
                          f"{CLUSTER_MODEL_STORE})")
    add_policy_options(ray, ("workers", "threads_per_worker"))  # a pod is the machine the policy is resolved for
    return parser.parse_args(argv)


def deploy(argv: list[str]) -> int:
    args = parse(argv)
    manifest = Manifest.read(args.export_dir)
    name = args.model_name or manifest.model.name
    if args.target == "ray":
        out = write_ray(args.out, args.export_dir, args.model_store, name, PolicyChoices.from_flags(args),
                        args.cluster_model_store, args.force)
        print(f"wrote {out}/: rayservice.yaml (KubeRay RayService, serveConfigV2 validated with Ray's schema), "
              f"storage/model-store/{name}.mar, storage-pvc.yaml (claim {CLAIM_NAME}: kubectl cp storage/. "
              f"{CLAIM_NAME}-upload:/pv/{storage_folder(name)})")
    elif args.target == "kserve":
        out = write_kserve(args.out, args.export_dir, args.model_store, name, args.storage_uri, args.force,
                           args.canary_percent)
        print(f"wrote {out}/: gpu/ and cpu/ (TorchServe runtime), kserve-engine/ (our image with ENGINE=kserve): "
              "storage/ + inferenceservice.yaml each; storage-pvc.yaml")
    else:
        out = write_triton(args.out, args.export_dir, name, args.instance_kind, args.storage_uri, args.force)
        print(f"wrote {out}/: model_repository/{name}/ (config.pbtxt, 1/model.onnx), inferenceservice-triton.yaml")
    return 0
