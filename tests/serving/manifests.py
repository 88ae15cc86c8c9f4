"""Small typed manifests for the serving tests' pure parts (the real ones come from the resnet18 export)."""

from __future__ import annotations

from contract.records import (
    ArtifactRecord,
    ImageContract,
    InputRecord,
    Manifest,
    ModelInfo,
    OutputRecord,
    ServingDecision,
)

FORMATS = {"traced": "torchscript", "scripted": "torchscript", "onnx-traced": "onnx", "onnx-dynamo": "onnx",
           "onnx-int8": "onnx"}


def record(kind: str, precision: str = "fp32") -> ArtifactRecord:
    return ArtifactRecord(kind=kind, path=f"{kind}.file", sha256="0" * 64, bytes=3, format=FORMATS[kind],
                          exporter="test", spatial_dynamic=True, accepts="any", precision=precision)


def manifest(served: str, kinds: tuple[str, ...], name: str = "resnet18", candidates: dict | None = None) -> Manifest:
    """A manifest whose decision serves `served`; every other kind is servable unless `candidates` says why not."""
    verdicts = {k: "served" if k == served else "servable (later in the preference order)" for k in kinds}
    verdicts.update(candidates or {})
    return Manifest(model=ModelInfo(name, "resnet", "a test"), weights={"kind": "random"},
                    input=InputRecord(example_shape=(1, 3, 224, 224), resizes_in_graph=True,
                                      preprocessing=ImageContract(256, (224, 224))),
                    output=OutputRecord(shape=["batch", 1000], labels="index_to_name.json", classes=1000), opset=18,
                    artifacts={k: record(k, "int8" if k == "onnx-int8" else "fp32") for k in kinds},
                    serving=ServingDecision(served=served, rule="test", preference=list(kinds), candidates=verdicts,
                                            servable=[k for k, v in verdicts.items() if v == "served"
                                                      or v.startswith("servable")]))
