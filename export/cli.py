"""`python -m export ...`: thin glue over the pipeline. Errors end as one line and a non-zero exit."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contract.cli import run_command
from contract.policy import EXPORT_PINS, add_policy_options
from contract.records import DECODE_MODES
from contract.versions import KEEP_VERSIONS
from export.forms import exporters, kinds
from runtime.integrity import SIGN_KEY_ENV, VERIFY_KEY_ENV

KEEP_HELP = ("versions of NAME the model store keeps (NAME.vN.mar, the newest, and always the live one, NAME.mar, "
             "and the one before it; only the first export of NAME makes NAME.mar, later ones go live with "
             f"`python -m serving rollout`; default {KEEP_VERSIONS})")


def build_parser() -> argparse.ArgumentParser:
    import models

    parser = argparse.ArgumentParser(
        prog="python -m export",
        description="Export a vision model to TorchScript (traced, scripted) and ONNX (legacy and torch.export), "
                    "verify eval mode, check parity against eager PyTorch, and package it for TorchServe.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for family in models.families():  # one command per model family of the registry
        served_name = family.entry_name("ARCH")
        sub = commands.add_parser(family.name, help=f"{family.description}, plus {served_name}.mar",
                                  description=f"Export {family.description} and package it as "
                                              f"model-store/{served_name}.mar (served at /predictions/{served_name}).")
        sub.set_defaults(command="family", family=family.name)
        sub.add_argument("--arch", default=family.default_arch, metavar="ARCH",
                         help=f"one of: {', '.join(family.archs)} (default: {family.default_arch})")
        _common(sub, family.weights_help, default_out="artifacts/<arch>")
        _archive_options(sub)
        if family.fine_tunable:
            _own_classes_options(sub)

    module = commands.add_parser("module", help="your own nn.Module from FILE.py:factory",
                                 description="Export your own module: the factory returns an nn.Module.")
    module.add_argument("reference", metavar="FILE.py:factory")
    module.add_argument("--input-shape", required=True, help="example input shape, batch first, e.g. 1,3,224,224")
    _common(module, "auto/random (as the factory builds it) | PATH to a state_dict", default_out="artifacts/<file>")
    module.add_argument("--model-store", type=Path, default=None,
                        help="also write NAME.mar there (only for image classifiers that take 1x3xHxW in [0, 1])")
    module.add_argument("--keep-versions", type=int, default=KEEP_VERSIONS, help=KEEP_HELP)
    _sign_option(module)
    module.add_argument("--labels", type=Path, default=None, metavar="FILE",
                        help="class names of the outputs: a JSON list, JSON {\"0\": name, ...}, or one name per line "
                             "(default: answers name each class by its index)")
    module.add_argument("--name", "--model-name", dest="name", default=None,
                        help="archive and URL name: NAME.mar, /predictions/NAME (default: the file's stem)")
    _serve_option(module)
    from models.user_tasks import AUTO, TASK_CHOICES
    module.add_argument("--task", choices=TASK_CHOICES, default=AUTO,
                        help="what the module answers (default: read from its output: a list of dicts with boxes, "
                             "labels, scores is a detector, a dict with 'out' a segmenter, a tensor a classifier; "
                             "a tensor of per-pixel class logits needs --task segmentation)")

    controlflow = commands.add_parser("controlflow", help="trace vs script on control-flow demo models",
                                      description="Export the control-flow demos and the ResNet resize branch; "
                                                  "report where traced artifacts silently go wrong.")
    controlflow.add_argument("--out", type=Path, default=Path("artifacts/controlflow"))
    controlflow.add_argument("--opset", type=int, default=exporters.DEFAULT_OPSET)

    parity = commands.add_parser("parity", help="re-check an existing export folder (hashes, then parity)",
                                 description="Verify every sha256 against manifest.json, then re-run parity.")
    parity.add_argument("folder", type=Path)
    _device_option(parity)

    explain = commands.add_parser(
        "explain", help="where a form diverges from eager: the first layer out of tolerance, with its source line",
        description="Run eager and one form of an export on the same batch with every intermediate kept, match "
                    "them by module and name the first one out of the form's tolerance (op, module path, the "
                    "model's line) and how the error grows; the int8 form is held to its fp32 source tensor by "
                    "tensor (SQNR). Writes divergence.KIND.md / .json into the folder.")
    explain.add_argument("folder", type=Path)
    explain.add_argument("--kind", required=True, help="the artifact kind to explain (see manifest.json)")
    explain.add_argument("--image", type=Path, default=None, metavar="PHOTO",
                         help="explain on this photo, made the model's input as served (default: the probe the "
                              "export recorded the form wrong on, else parity's inputs and the probes)")

    return parser


def _own_classes_options(sub) -> None:
    sub.add_argument("--labels", type=Path, default=None, metavar="FILE",
                     help="your classes' names, with --weights CKPT fine-tuned on them: one per line, a JSON list or "
                          "JSON {\"0\": name, ...}; torchvision's __background__ is put at index 0 when the file "
                          "has one name fewer than the model's classes (default: answers name classes by index)")
    sub.add_argument("--num-classes", type=int, default=None, metavar="N",
                     help="classes of --weights CKPT, background included (default: read from the checkpoint's head)")


def _common(sub, weights_help: str, default_out: str) -> None:
    sub.add_argument("--weights", default="auto", help=f"{weights_help} (default: auto)")
    sub.add_argument("--out", type=Path, default=None, help=f"output folder (default: {default_out})")
    sub.add_argument("--opset", type=int, default=exporters.DEFAULT_OPSET,
                     help=f"ONNX opset (default: {exporters.DEFAULT_OPSET})")
    _device_option(sub)
    _precision_options(sub)
    sub.add_argument("--no-benchmark", action="store_true",
                     help="skip the short in-process latency of each form (about a second each) in the table the "
                          "export prints last and in report.html")
    _holdout_option(sub)


def _holdout_option(sub) -> None:
    from export.package.holdout import HOLDOUT_FOLDER, MAX_HOLDOUT_BYTES, OPTION
    from gates.photos import MAX_FOLDER_PHOTOS
    sub.add_argument(OPTION, type=Path, default=None, metavar="DIR",
                     help=f"carry your held-out photos of the model's own domain (a face detector's: faces) in the "
                          f"export ({HOLDOUT_FOLDER}/) and its archive, recorded in manifest.json with their sha256: "
                          "`python -m serving rollout` judges this version against the live one on them. JPEG or "
                          f"PNG, at most {MAX_FOLDER_PHOTOS} and {MAX_HOLDOUT_BYTES // 2**20} MiB in all; any "
                          "other file is refused before anything is written (hidden files are left behind)")


def _precision_options(sub) -> None:
    from export.precision.calibration import DEFAULT_CALIBRATION_SAMPLES
    from export.precision.gate import GATE_ENFORCE, GATE_MODES
    from export.precision.request import AUTO_PRECISION
    sub.add_argument("--precision", default=AUTO_PRECISION, metavar="LIST",
                     help=f"comma-separated: fp32 plus any of {', '.join(kinds.precisions()[1:])} (int8: ONNX Runtime "
                          "static QDQ and OpenVINO NNCF; bf16: CPU autocast and OpenVINO; fp16: GPU, needs --device "
                          "cuda); or 'target': those fast on the --target machine that this one can build and gate. "
                          "Each variant is gated on accuracy. Default 'auto': 'target' for a classifier with trained "
                          "weights (a variant failing its gate is set aside, the export goes on), fp32 otherwise; "
                          "--precision fp32 builds none")
    sub.add_argument("--calibration", type=Path, default=None, metavar="DIR",
                     help="int8 calibration images in ImageFolder layout DIR/<class>/<image> (default: scikit-image "
                          "sample photographs and generated photo-like images; see docs/results/2026-11-23-precision-ladder/)")
    sub.add_argument("--calibration-samples", type=int, default=DEFAULT_CALIBRATION_SAMPLES, metavar="N",
                     help="images taken from --calibration, classes in turn (default: %(default)s)")
    sub.add_argument("--validation", type=Path, default=None, metavar="DIR",
                     help="held-out images for the accuracy gate, ImageFolder layout; class folders named after the "
                          "model's labels (or output indices) add top-1/top-5 accuracy (default: the held-out half "
                          "of the default set)")
    sub.add_argument("--gate", choices=GATE_MODES, default=None,
                     help="enforce: a variant failing the accuracy gate fails the export (exit 5); report: keep it "
                          f"marked not servable and exit 0 (default: {GATE_ENFORCE} for precisions named in --precision, "
                          "report for those the tool chose)")


def _device_option(sub) -> None:
    sub.add_argument("--device", default="cpu",
                     help="where artifacts run for parity: cpu, or cuda[:N] (ONNX Runtime's CUDA provider, "
                          "TorchScript on that GPU); eager stays on CPU as the reference (default: cpu)")


def _sign_option(sub) -> None:
    sub.add_argument("--sign-key", type=Path, default=None, metavar="PEM",
                     help=f"sign the archive with this Ed25519 private key (default: ${SIGN_KEY_ENV}, if set); "
                          f"servers with the public key in ${VERIFY_KEY_ENV} refuse archives it did not sign")


def _archive_options(sub) -> None:
    sub.add_argument("--model-store", type=Path, default=Path("model-store"),
                     help="where ARCH.mar is written (default: model-store)")
    sub.add_argument("--no-archive", action="store_true", help="skip the TorchServe archive")
    sub.add_argument("--keep-versions", type=int, default=KEEP_VERSIONS, help=KEEP_HELP)
    _sign_option(sub)
    sub.add_argument("--name", default=None,
                     help="archive and URL name: NAME.mar, /predictions/NAME (default: the arch, e.g. resnet50); "
                          "exporting another model into the same store never overwrites it")
    _serve_option(sub)
    add_policy_options(sub, EXPORT_PINS, pinned=True)


def _formats_option(sub) -> None:
    off = "; ".join(f"{k.name}: {k.off_by_default}" for k in kinds.fp32_kinds() if k.off_by_default)
    sub.add_argument("--formats", default=None, metavar="LIST", type=_formats_list,
                     help=f"comma-separated fp32 artifact kinds to build, or 'default' / 'all', e.g. "
                          f"default,aotinductor (kinds: {', '.join(k.name for k in kinds.fp32_kinds())}; a kind made "
                          f"from another brings it along; default: {', '.join(kinds.default_formats())} - every kind "
                          f"but those that cost more than they give most exports: {off})")


def _formats_list(text: str) -> list[str]:
    names = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        names += {"default": kinds.default_formats(), "all": [k.name for k in kinds.fp32_kinds()]}.get(name, [name])
    if not names:
        raise argparse.ArgumentTypeError("give at least one kind, 'default' or 'all'")
    return list(dict.fromkeys(names))


def _serve_option(sub) -> None:
    _formats_option(sub)
    sub.add_argument("--decode", choices=DECODE_MODES, default="draft",
                     help="draft: large JPEGs are decoded at 1/2, 1/4 or 1/8 scale in the DCT domain (much faster "
                          "on phone photos: docs/results/2026-11-24-serving-bench-photo-sizes/analysis.md), kept at least twice the resize per side, if the "
                          "export's decode check "
                          "on phone-sized photos passes with the served artifact (else exact); exact: every pixel, "
                          "always (default: %(default)s; manifest.json 'decode_check' has the numbers)")
    from runtime.machine import PROFILES
    sub.add_argument("--target", default=None, choices=sorted(PROFILES), metavar="PROFILE",
                     help=f"the machine the serving order is decided for: {', '.join(PROFILES)} (default: this "
                          "machine); the manifest's served form is the first candidate it meets. The archive ships "
                          "the gated candidates in order; at load the engine measures those the machine it runs on "
                          "meets and serves the first within a margin of the fastest (docs/hardware-choice.md). "
                          "With --precision target, the precisions that are fast on it are built")
    ranked = ", ".join(kinds.serving_preference())
    sub.add_argument("--serve", default=None, metavar="KIND", choices=kinds.names(),
                     help=f"kind to serve instead of the rule's choice, among those that pass parity, the accuracy "
                          f"gate and the handler's input: {', '.join(kinds.names())} (default: the first servable of "
                          f"{ranked}; the decision and why each other kind was not chosen are in manifest.json "
                          "'serving')")


MEASUREMENTS = {"bench": "inprocess", "aoti-tuning": "aoti-tuning"}  # now python -m measure


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in MEASUREMENTS:
        from contract.cli import moved
        return moved(f"python -m export {argv[0]}", f"python -m measure {MEASUREMENTS[argv[0]]}")
    args = build_parser().parse_args(argv)
    from export import commands  # imported late: --help stays fast
    return run_command(lambda: getattr(commands, f"{args.command}_command")(args))


if __name__ == "__main__":
    sys.exit(main())
