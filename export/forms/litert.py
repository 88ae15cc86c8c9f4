"""LiteRT files: the model converted by litert-torch (torch.export -> LiteRT's converter) to a `.tflite` that
LiteRT's interpreter loads on Android, iOS, Linux and boards (docs/devices.md), with its input contract beside it.

The file takes one image at the example's height x width: a device feeds one fixed-size image, and the serving
backend runs a batch one image at a time. So the module itself is converted, at that one size, not its torch.export
form: that form keeps a size-dependent branch (EfficientNet-Lite's resize) as torch.cond, which LiteRT's converter
has no lowering for, and a file of one size takes one path of it. litert-torch keeps the module's NCHW input (it
transposes inside the graph for LiteRT's NHWC kernels); the contract records the input shape the interpreter
reports, checked, not assumed.

A model litert-torch cannot convert is refused with the converter's own reason.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from contract.files import atomic_write_bytes, atomic_write_text
from contract.records import LABELS_NAME
from export.errors import ExportError
from export.forms.exporters import Artifact, BuildContext
from runtime.device_programs import batch1_latency
from runtime.litert import INSTALL, SIGNATURE, contract_name, import_interpreter, output_names


class ConversionError(ExportError):
    """A model litert-torch cannot convert, or no litert-torch here: the message says which and why."""


def convert(context: BuildContext, kind) -> Artifact:
    """The fp32 `.tflite` of the module at the example's size, its contract and latency beside it."""
    converter = import_converter()  # no litert-torch: refused naming how to install it, before the slow export
    artifact = context.artifact(kind, loaded=context.module)
    artifact.spatial_dynamic = False  # converted for the example's height x width
    try:
        model = converter.convert(context.module, (context.example[:1],))
    except Exception as error:  # noqa: BLE001 - torch.export and the MLIR converter raise many types
        raise ConversionError(f"litert-torch could not convert it: {type(error).__name__}: "
                              f"{_first_line(error)}") from error
    content = model.model_content()
    atomic_write_bytes(artifact.path, content)
    artifact.details = write_contract(context, artifact.path, len(content))
    return artifact


def import_converter() -> ModuleType:
    """litert_torch (with LiteRT's interpreter, which parity runs it in), or a ConversionError saying how to get it."""
    try:
        converter = importlib.import_module("litert_torch")
        import_interpreter()
    except Exception as error:  # noqa: BLE001 - ImportError, or the ArtifactError of a missing interpreter
        raise ConversionError(f"LiteRT needs the litert-torch package ({_first_line(error)}); {INSTALL}") from None
    return converter


def write_contract(context: BuildContext, path, size: int) -> dict:
    """What a device developer feeds the file, written beside it (runtime.litert.contract_name), with its size and
    batch-1 latency at one thread and at this machine's cores; returned for the manifest."""
    image = context.image
    contract = {
        "model": path.name, "signature": SIGNATURE, "precision": "fp32", "litert_torch": _version("litert-torch"),
        "ai_edge_litert": _version("ai-edge-litert"),
        **signature(path, tuple(context.example[:1].shape)),
        "preprocessing": ({"resize_shorter_side_to": image.resize, "centre_crop": list(image.crop),
                           "interpolation": image.interpolation, "source": image.source} if image else None),
        "outputs": list(context.io.outputs),
        "labels": LABELS_NAME if context.labels else None,
        "bytes": size,
    }
    atomic_write_text(path.with_name(contract_name(path.name)), _json(contract))
    contract["latency_ms_batch1"] = batch1_latency("litert", path, context.example[:1])
    atomic_write_text(path.with_name(contract_name(path.name)), _json(contract))
    return contract


def signature(path, example_shape: tuple[int, ...]) -> dict:
    """The input's name and shape as LiteRT's interpreter reports them: the module's own NCHW, which the backend and
    the contract promise (a converter that moved the channels to the input would be refused here, not mislabelled),
    and the signature's names of the outputs, in the module's order."""
    runner = import_interpreter().Interpreter(model_path=str(path)).get_signature_runner(SIGNATURE)
    (name, details), = runner.get_input_details().items()
    shape = [int(d) for d in details["shape"]]
    if shape != list(example_shape):
        raise ConversionError(f"litert-torch wrote an input of shape {shape} for an NCHW example of "
                              f"{list(example_shape)}")
    return {"input": {"name": name, "shape": shape, "layout": "NCHW", "dtype": "float32",
                      "values": "RGB in [0, 1] (pixel / 255)",
                      "normalisation": "in the graph: send the pixels scaled to [0, 1], nothing subtracted"},
            "signature_outputs": output_names(len(runner.get_output_details()))}



def _version(package: str) -> str:
    from importlib.metadata import version
    return version(package)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]


def _json(data: dict) -> str:
    import json
    return json.dumps(data, indent=2) + "\n"
