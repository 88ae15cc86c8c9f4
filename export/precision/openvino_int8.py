"""openvino-int8: NNCF post-training quantization of the fp32 OpenVINO IR, gated like onnx-int8.

`nncf.quantize` with the calibration images (the same ones ONNX Runtime's int8 is calibrated on). When that fails
the accuracy gate, `nncf.quantize_with_accuracy_control` returns the most sensitive layers to fp32 until the top-1
agreement with fp32 on the calibration images (never the held-out ones the gate judges on) drops by at most
MAX_DROP, and the result is gated on the held-out images. The nodes left in fp32 are counted from the IR itself.
NNCF's log lines become warnings, captured by the export's warning log (export.warnings_log) with the step's.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from pathlib import Path

import torch

from export.errors import ExportError
from export.forms.openvino_ir import save_ir
from export.precision.builder import Variant, VariantContext
from export.precision.gate import INT8_TOLERANCE, gated_top1
from export.precision.held_out import run_batches
from export.precision.int8_fallback import MAX_FP32_NODES, RANKING_STRIDE, selection_tolerance
from gates.topk import agreement_metrics
from runtime import RunOptions, open_artifact
from runtime.openvino import INSTALL, import_openvino
from runtime.signal_stack import keep_signal_stack

# The accuracy-control target, in the gate's own metric (top-1 agreement with fp32): int8_fallback's stricter share
# of the gate's allowed disagreement, so that both fallbacks aim at the same target and are comparable.
MAX_DROP = round(1.0 - selection_tolerance(INT8_TOLERANCE).min_top1_agreement, 6)
# ... and the same budget: at most MAX_FP32_NODES layers reverted, ranked on every RANKING_STRIDE-th calibration
# image. Uncapped, NNCF reverts layer after layer and did not finish on a small CPU (docs/results/2026-11-25-openvino-kinds/).
COMPUTE_OPS = ("Convolution", "GroupConvolution", "MatMul")  # the ops whose int8 kernels carry the speed-up
QUANTIZE_OPS = ("FakeQuantize", "FakeConvert")


def import_nncf():
    try:
        import nncf
    except ImportError as error:
        raise ExportError(f"openvino-int8 needs the nncf package ({error}); {INSTALL}") from None
    return nncf


def build_openvino_int8(context: VariantContext, kind, source) -> Variant:
    """The int8 IR in the stage (kind.file_name and its weights), gated; plain quantization first."""
    stage, calibration, held_out, progress = context.stage, context.calibration, context.held_out, context.progress
    openvino, nncf = import_openvino(), import_nncf()
    fp32_ir = openvino.Core().read_model(str(source.path))
    images = [image[None].numpy() for image in calibration.images]  # batches of one: NNCF counts items
    started = time.perf_counter()
    with nncf_logs_as_warnings():
        quantized = nncf.quantize(fp32_ir, nncf.Dataset(images), subset_size=len(images))
    keep_signal_stack()  # NNCF compiled models on this thread to collect statistics (runtime/signal_stack.py)
    timings = {"quantize_s": round(time.perf_counter() - started, 2)}
    backend, gate = _save_and_gate(quantized, stage / kind.file_name, kind, held_out)
    plain = {"gate": gate.verdict, "top1_agreement": gate.metrics["top1_agreement"], **int8_census(quantized)}
    progress.step(f"openvino-int8 (nncf.quantize): gate {gate.verdict}")
    restored = None
    if not gate.passed and not held_out.can_judge:
        restored = {"skipped": held_out.cannot_judge_note()}
    elif not gate.passed and context.automatic and kind.precision in context.passed:
        restored = {"skipped": "another int8 form passed its gate already (--precision auto); --precision int8 "
                               "runs NNCF's accuracy control anyway"}
        progress.step(f"openvino-int8: accuracy control skipped: {restored['skipped']}")
    elif not gate.passed:
        started = time.perf_counter()
        quantized = accuracy_controlled(nncf, fp32_ir, images, _fp32_logits(source, calibration.images))
        keep_signal_stack()
        timings["accuracy_control_s"] = round(time.perf_counter() - started, 2)
        backend, gate = _save_and_gate(quantized, stage / kind.file_name, kind, held_out)
        restored = {"max_drop": MAX_DROP, "metric": "top-1 agreement with fp32 on the calibration images",
                    "max_num_iterations": MAX_FP32_NODES, "ranking_subset_size": ranking_subset(images),
                    **int8_census(quantized)}
        progress.step(f"openvino-int8 with accuracy control: {len(restored['fp32_ops'])} op(s) left in fp32, "
                      f"gate {gate.verdict}")
    controlled = bool(restored) and "skipped" not in restored
    made_by = {"tool": "nncf.quantize" + (" + nncf.quantize_with_accuracy_control" if controlled else ""),
               "nncf": nncf.__version__, "openvino": openvino.get_version(), "calibration_images": len(images),
               "plain_quantization": plain, "accuracy_control": restored, "timings": timings}
    return Variant(kind=kind.name, path=stage / kind.file_name, format=kind.format, precision=kind.precision,
                   run_precision=kind.run_precision, source=source.kind, made_by=made_by, gate=gate,
                   images_per_s=held_out.speed(backend))


def accuracy_controlled(nncf, fp32_ir, images: list, reference: torch.Tensor):
    """quantize_with_accuracy_control on the calibration images, judged by top-1 agreement with fp32's logits
    (each validation item carries its image and fp32's logits, so NNCF may validate any subset)."""
    validation = nncf.Dataset(list(zip(images, reference)), lambda item: item[0])

    def agreement(compiled, items) -> float:
        items = list(items)
        outputs = torch.cat([torch.from_numpy(compiled(image)[0]) for image, _ in items])
        return gated_top1(agreement_metrics(torch.stack([logits for _, logits in items]), outputs))[0]

    budget = nncf.AdvancedAccuracyRestorerParameters(max_num_iterations=MAX_FP32_NODES,
                                                     ranking_subset_size=ranking_subset(images))
    with nncf_logs_as_warnings():
        return nncf.quantize_with_accuracy_control(fp32_ir, nncf.Dataset(images), validation, agreement,
                                                   max_drop=MAX_DROP, subset_size=len(images),
                                                   advanced_accuracy_restorer_parameters=budget)


def ranking_subset(images: list) -> int:
    return max(1, len(images) // RANKING_STRIDE)


def _save_and_gate(model, path: Path, kind, held_out):
    """Saved as the kind's file and opened as it is served: what is gated is what ships."""
    save_ir(model, path)
    backend = open_artifact(kind.format, path, RunOptions(), name=f"{kind.name} candidate")
    return backend, held_out.gate(kind, backend)


def _fp32_logits(source, images: torch.Tensor) -> torch.Tensor:
    """The fp32 IR's logits (it passed parity with eager) on the calibration images: accuracy control's reference."""
    return run_batches(open_artifact(source.format, source.path, RunOptions(), name="fp32 source"), images)


def int8_census(model) -> dict:
    """Compute ops (convolutions, matmuls) whose input is quantized, and those left in fp32, from the IR."""
    int8, fp32 = [], []
    for op in model.get_ordered_ops():
        if op.get_type_name() in COMPUTE_OPS:
            producer = op.input_value(0).get_node()
            (int8 if producer.get_type_name() in QUANTIZE_OPS else fp32).append(op.get_friendly_name())
    return {"int8_ops": len(int8), "fp32_ops": fp32}


class _WarningsHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        warnings.warn(f"nncf: {record.getMessage()}", stacklevel=2)


@contextlib.contextmanager
def nncf_logs_as_warnings():
    """NNCF logs to its own stdout handler (progress, statistics): warnings and errors go to the export's warning
    log instead, the rest is dropped."""
    logger = logging.getLogger("nncf")
    saved = logger.handlers[:], logger.level, logger.propagate
    handler = _WarningsHandler(logging.WARNING)
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.handlers, logger.level, logger.propagate = saved[0], saved[1], saved[2]
