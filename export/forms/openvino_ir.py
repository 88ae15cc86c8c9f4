"""OpenVINO IR (model.xml + model.bin) converted from the traced ONNX file (onnx-traced).

Why the traced file: it holds the one path the example took, without If nodes. The torch.export-based file keeps
the in-graph resize as an If, which OpenVINO does not fold and which NNCF calibrates body by body: the untaken
body gets no samples and int8 is refused ("Calibration dataset must not be empty"), on ResNet and EfficientNet-Lite
alike; from the traced file NNCF quantizes them. The IR takes only the example's size (as below), and trace vs
script probes it like every form, so a model whose path depends on its data is caught there and not served.

Why from an ONNX file and not from the ExportedProgram (openvino.convert_model accepts both): from the
ExportedProgram, EfficientNet-Lite0's IR computed wrong logits and cf-loop's torch.while_loop did not convert at
all (OpConversionFailure on `ge`); from the ONNX file both match eager on every path, ResNet-50 either way, and
conversion is faster. The ONNX file has also passed its own structural checks and parity by then.

The IR takes exactly the example's height x width (any batch): with height and width left dynamic, OpenVINO's
CPU plugin computed EfficientNet-Lite0 wrong at its own example size (ONNX Runtime is right on the same file),
while with them fixed at conversion it matches eager. The handler sends the example's size anyway (the crop of
the image contract). The measurements behind each choice: docs/results/2026-11-25-openvino-kinds/.

Weights are saved in fp32 (`compress_to_fp16=False`): save_model's default fp16 weight compression would break
fp32 parity. Both files are written under temporary names and renamed into place, the weights first: the .xml
(the file the manifest names) appears only when its weights are complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from export.forms.exporters import Artifact, BuildContext
from runtime.openvino import companion_weights, import_openvino  # no openvino package: a refusal naming the extra


def ir_from_onnx(context: BuildContext, kind) -> Artifact:
    """openvino.convert_model of the kind's `needs[0]` ONNX file at the example's height x width (any batch),
    saved with fp32 weights."""
    openvino = import_openvino()
    source = context.built[kind.needs[0]]
    artifact = context.artifact(kind)
    fixed_size = [-1, *context.example.shape[1:]]  # any batch, the example's height and width: see the docstring
    save_ir(openvino.convert_model(str(source.path), input=fixed_size), artifact.path)
    artifact.details = {"converted_from": source.path.name, "openvino": openvino.get_version(),
                        "weights": "fp32 (compress_to_fp16=False)"}
    return artifact


def save_ir(model, xml_path: Path) -> None:
    """openvino.save_model into a scratch folder beside `xml_path`, then both files renamed into place."""
    openvino = import_openvino()
    xml_path = Path(xml_path)
    scratch = Path(tempfile.mkdtemp(dir=xml_path.parent, prefix=f".{xml_path.name}."))
    try:
        openvino.save_model(model, str(scratch / xml_path.name), compress_to_fp16=False)
        weights = companion_weights(xml_path.name)
        for name in (weights, xml_path.name):  # weights first: a complete .xml means complete weights
            os.chmod(scratch / name, 0o644)  # readers (TorchServe, docker) are other users
            os.replace(scratch / name, xml_path.parent / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def ir_files(xml_path: Path) -> tuple[Path, Path]:
    return Path(xml_path), Path(xml_path).with_name(companion_weights(Path(xml_path).name))
