"""The contract between export and serving: typed records, JSON in and out, and refusals that say what to do."""

import json

import pytest

from contract.handler_config import HandlerConfig, read_labels
from contract.records import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    ArtifactRecord,
    ContractError,
    ImageContract,
    InputRecord,
    Manifest,
    ModelInfo,
    OutputRecord,
    SchemaVersionError,
    ServingDecision,
)


def a_manifest(served="onnx-dynamo") -> Manifest:
    record = ArtifactRecord(kind="onnx-dynamo", path="model.dynamo.onnx", sha256="0" * 64, bytes=3, format="onnx",
                            exporter="torch.onnx.export(dynamo=True)", spatial_dynamic=True, accepts="any")
    return Manifest(model=ModelInfo("resnet18", "resnet", "a test", {"registry": "resnet18"}),
                    weights={"kind": "random"},
                    input=InputRecord(example_shape=(1, 3, 224, 224), resizes_in_graph=True,
                                      preprocessing=ImageContract(256, (224, 224))),
                    output=OutputRecord(shape=["batch", 1000], labels="index_to_name.json", classes=1000), opset=18,
                    artifacts={"onnx-dynamo": record},
                    serving=ServingDecision(served=served, rule="first", preference=["onnx-dynamo"],
                                            candidates={"onnx-dynamo": "served"}, servable=["onnx-dynamo"]))


def test_a_manifest_survives_json_unchanged(tmp_path):
    manifest = a_manifest()
    (tmp_path / MANIFEST_NAME).write_text(manifest.to_json())
    again = Manifest.read(tmp_path)
    assert again == manifest
    assert again.input.preprocessing.crop == (224, 224) and again.input.handler_input() == (3, 224, 224)
    assert again.served_record().path == "model.dynamo.onnx"


def test_another_schema_version_names_both_versions_and_what_to_do(tmp_path):
    data = a_manifest().to_dict()
    data["schema"] = 1
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(SchemaVersionError) as caught:
        Manifest.read(tmp_path)
    message = str(caught.value)
    assert "version 1" in message and f"version {SCHEMA_VERSION}" in message and "re-run the export" in message


def test_missing_and_unknown_fields_are_named():
    data = a_manifest().to_dict()
    del data["artifacts"]["onnx-dynamo"]["sha256"]
    data["artifacts"]["onnx-dynamo"]["colour"] = "blue"
    with pytest.raises(ContractError, match="artifacts.onnx-dynamo: missing sha256; unknown colour"):
        Manifest.from_dict(data)


def test_a_decision_naming_nothing_servable_lists_every_reason():
    manifest = a_manifest(served=None)
    manifest.serving.candidates = {"onnx-dynamo": "failed parity", "traced": "silently diverges"}
    with pytest.raises(ContractError, match="onnx-dynamo: failed parity; traced: silently diverges"):
        manifest.served_record()


def test_a_decision_naming_an_unrecorded_artifact_is_refused():
    with pytest.raises(ContractError, match="names 'scripted', which the manifest does not record"):
        a_manifest(served="scripted").served_record()


def test_a_model_without_an_image_contract_cannot_be_served_by_the_image_handler():
    record = InputRecord(example_shape=(1, 16))
    assert record.handler_input() is None
    with pytest.raises(ContractError, match="takes no RGB image input"):
        record.image_contract()


@pytest.mark.parametrize("settings, problem", [
    ({"artifact": "traced"}, "unknown artifact"),
    ({"topk": 0}, "topk must be from 1 to 100"),
    ({"threads": 0}, "threads must be at least 1"),
    ({"topk": "abc"}, "topk must be a number, got 'abc'"),
    ({"fp16": "yes"}, "fp16 must be true or false"),
])
def test_handler_settings_are_checked(settings, problem):
    with pytest.raises(ContractError, match=problem):
        HandlerConfig.from_dict(settings)


def test_handler_settings_round_trip_and_defaults():
    assert HandlerConfig.from_dict(None) == HandlerConfig()
    config = HandlerConfig.from_dict({"topk": 3, "threads": 2})
    assert HandlerConfig.from_dict(config.to_dict()) == config


def test_image_contract_rejects_nonsense_and_unknown_decode_modes():
    with pytest.raises(ContractError, match="must be positive"):
        ImageContract(0, (224, 224))
    with pytest.raises(ContractError, match="decode 'turbo' is not one of exact"):
        ImageContract(256, (224, 224), decode="turbo")


def test_labels_are_read_as_integer_keys_or_refused(tmp_path):
    (tmp_path / "labels.json").write_text(json.dumps({"0": "tench", "1": "goldfish"}))
    assert read_labels(tmp_path / "labels.json") == {0: "tench", 1: "goldfish"}
    (tmp_path / "broken.json").write_text("[1, 2]")
    with pytest.raises(ContractError, match="cannot be read"):
        read_labels(tmp_path / "broken.json")


def test_the_resize_rule_keeps_the_aspect_and_fits_within_its_sides():
    from contract.records import ResizeRule
    rcnn = ResizeRule(min_side=800, max_side=1333)
    assert rcnn.size(3024, 4032) == (800, 1067)  # a 12 MP photo: the shorter side to 800
    assert rcnn.size(400, 2000) == (267, 1333)  # a panorama: the longer side stops at 1333
    assert rcnn.size(10, 10) == (800, 800)  # small images are enlarged, as the model's transform does
    ssd = ResizeRule(min_side=320, max_side=320, fixed=(320, 320))
    assert ssd.size(3024, 4032) == (240, 320) and ssd.fixed == (320, 320)
    assert ResizeRule.from_dict({"min_side": 520, "max_side": 4096}) == ResizeRule(520, 4096)
    with pytest.raises(ContractError, match="max_side at least min_side"):
        ResizeRule(min_side=800, max_side=100)


def test_a_manifest_names_its_task_and_refuses_one_it_does_not_know():
    assert Manifest.__dataclass_fields__["task"].default == "classification"
    with pytest.raises(ContractError, match="task 'captioning' is not one of classification, detection, segmentation"):
        Manifest.from_dict({"schema": SCHEMA_VERSION, "task": "captioning", "model": {}, "input": {}, "output": {}})


@pytest.mark.parametrize("setting", ["topk", "simulate_hang_s"])
def test_a_null_handler_setting_is_named_not_a_type_error(setting):
    from contract.handler_config import HandlerConfig
    with pytest.raises(ContractError, match=setting):
        HandlerConfig.from_dict({setting: None})
    assert HandlerConfig.from_dict({"threads": None}).threads is None  # null threads: not pinned


def test_a_value_range_is_two_numbers():
    from contract.records import InputRecord
    with pytest.raises(ContractError, match="value_range"):
        InputRecord((1, 3, 8, 8), value_range=(0.0, 0.5, 1.0))
