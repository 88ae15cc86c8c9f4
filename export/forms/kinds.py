"""The table of artifact kinds: one row per kind of file an export can write.

A row says everything the pipeline, parity, selection, precision and the CLI need to know about a kind: its
file name, its format (which runtime backend opens it), how it is built, the tolerance parity holds it to,
where it stands in the serving preference and why, and which input sizes it accepts. They iterate this
table instead of naming kinds. A new backend is one row here (`register`), one backend file in runtime/ and
one exporter function (`build(context, kind) -> exporters.Artifact`). Any exporter may refuse a model: the
pipeline records the refusal (export.refusals) and goes on with the other kinds.

Reduced-precision variants (int8, fp16, bf16) are rows too: export.precision.variants builds and gates them from an
fp32 source named in `sources`; they are not held to eager by parity but by the accuracy gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from contract.records import CLASSIFICATION, DETECTION
from export.errors import ExportError
from export.forms import executorch, exporters, litert, openvino_ir, torch_export
from export.forms.tolerances import (
    AOTINDUCTOR_TOLERANCE,
    EXPORTED_PROGRAM_TOLERANCE,
    ONNX_TOLERANCE,
    OPENVINO_TOLERANCE,
    TORCHSCRIPT_TOLERANCE,
    Tolerance,
)
from runtime.machine import BF16_FLAGS, CPU, CUDA, Needs

# Formats: the runtime backend that opens a kind's file (keys of runtime.base.BACKENDS).
TORCHSCRIPT, TORCH_EXPORT, AOTI, ONNX, OPENVINO = "torchscript", "torch-export", "aoti", "onnx", "openvino"
EXECUTORCH = "executorch"
LITERT = "litert"
FP32 = "fp32"  # the precision every fp32 kind computes in; variants name theirs

# Which input sizes a kind accepts (a row's `input_sizes`).
EXAMPLE_SIZE, MODEL_SIZES, SOURCE_SIZES = "example", "model", "source"
INPUT_SIZES = {
    EXAMPLE_SIZE: "exactly the example's height x width (the traced size)",
    MODEL_SIZES: "any height x width when the model resizes in its graph, else the example's",
    SOURCE_SIZES: "what the fp32 artifact it was made from accepts",
}


@dataclass(frozen=True)
class ArtifactKind:
    name: str
    file_name: str
    format: str  # the runtime backend that opens it (runtime.base.BACKENDS)
    exporter: str  # how it is made, in words (recorded in the manifest)
    input_sizes: str  # a key of INPUT_SIZES
    serving_rank: int | None  # lower is preferred; None: served only when asked for with --serve
    rank_reason: str
    tolerance: Tolerance | None = None  # parity against eager; None: gated on accuracy instead
    build: Callable | None = None  # fp32 kinds: build(context, kind) -> exporters.Artifact
    needs: tuple[str, ...] = ()  # kinds built first whose in-memory module (a variant: whose file) this one reads
    precision: str = FP32
    # RunOptions.precision its backend runs it with: fp32 for a file that holds its precision (int8 runs as-is); a
    # file run in another precision names it (bf16 autocast, OpenVINO's bf16 hint, an int8 IR's remainder in bf16)
    run_precision: str = FP32
    sources: tuple[str, ...] = ()  # variants: the fp32 kinds it may be made from, in order of preference
    off_by_default: str = ""  # why --formats leaves it out unless asked for (empty: built by default)
    announce: str = ""  # a slow exporter's progress line before it starts
    runs_on: Needs = Needs()  # what a machine needs to run it at all (fp16: a CUDA GPU)
    fast_on: Needs = Needs()  # what it needs to be fast, besides running (bf16: native bf16 instructions)
    fast_why: str = ""  # the measurement behind fast_on (docs/hardware-choice.md)
    companions: tuple[str, ...] = ()  # files beside file_name that it opens too (an OpenVINO IR's weights)
    task: str = CLASSIFICATION  # variants: the task whose gate judges it (top-1 agreement, or boxes for detection)
    for_devices: bool = False  # a device program: built only when named, never added by --precision auto for a server

    def __post_init__(self):
        if self.input_sizes not in INPUT_SIZES:
            raise ValueError(f"kind {self.name}: input_sizes must be one of {', '.join(INPUT_SIZES)}")
        if self.precision == FP32 and (self.build is None or self.tolerance is None):
            raise ValueError(f"kind {self.name}: an fp32 kind needs an exporter (build) and a parity tolerance")

    @property
    def is_variant(self) -> bool:
        return self.precision != FP32

    @property
    def runs_beyond_its_precision(self) -> bool:
        """It runs in a precision the request did not name (int8 with its remainder in bf16): built only where that
        precision is fast (export.precision.request.left_out_here)."""
        return self.run_precision not in (FP32, self.precision)

    def spatial_dynamic(self, resizes_in_graph: bool, source_dynamic: bool = False) -> bool:
        """Whether the artifact accepts spatial sizes other than the example's."""
        return {EXAMPLE_SIZE: False, MODEL_SIZES: resizes_in_graph, SOURCE_SIZES: source_dynamic}[self.input_sizes]


# Why ONNX Runtime's forms rank first among the fp32 kinds (measured: docs/benchmarks.md).
ONNX_RUNTIME_FIRST = "ONNX Runtime is ahead of TorchScript in CPU throughput (docs/benchmarks.md)"
ONNX_SOURCES = ("onnx-traced", "onnx-dynamo", "onnx-scripted")  # an ONNX variant's sources, in preference order
_TABLE: dict[str, ArtifactKind] = {}

# A row's rank_reason and fast_why say why in words; the measurements behind the ranks and the needs of the reduced
# precision and OpenVINO rows (`python -m measure inprocess`, the forms taking turns, on CPUs with and without VNNI
# and native bf16, at the CPU serving policy's own setting and at 2 threads, batch 8) are in one document:
MEASURED = "docs/hardware-choice.md"
OPENVINO_IR, OPENVINO_WEIGHTS = "model.openvino.xml", "model.openvino.bin"
OPENVINO_INT8_IR, OPENVINO_INT8_WEIGHTS = "model.int8.openvino.xml", "model.int8.openvino.bin"
OPENVINO_FP32_RANK = ("just after onnx-dynamo: slower than ONNX Runtime fp32 on two of the three CPUs measured, a "
                      "little ahead on the third, by less than a new rank would need to be worth; CPU only "
                      f"({MEASURED})")
OPENVINO_FP32_WHY = "OpenVINO's CPU plugin; its GPU plugin is for Intel GPUs, so a CUDA machine serves other forms"
OPENVINO_INT8_RANK = ("first: the fastest int8 on every CPU measured, with VNNI or without; served only within the "
                      f"gate ({MEASURED})")
OPENVINO_INT8_WHY = ("OpenVINO's int8 CPU kernels: ahead of ONNX Runtime fp32 even without VNNI, further with it "
                     f"({MEASURED})")
OPENVINO_BF16_RANK = ("after the int8 forms and before fp32: at the CPU policy's one thread per worker, batch 1, it "
                      "ran a little behind onnx-int8 (ahead of both int8 forms only at 2 threads, batch 8); chosen "
                      f"only on a CPU that computes in bf16 ({MEASURED})")
# openvino-int8-bf16's figures are in docs/results/2026-11-23-precision-ladder/ (a kind added after the document above was measured).
OPENVINO_INT8_BF16_RANK = ("after openvino-int8 (the same IR with its remainder in f32: nearer fp32, so a near tie "
                           "goes to it) and before onnx-int8 and openvino-bf16, which it ran ahead of at one thread, "
                           "batch 1; chosen only on a CPU that computes in bf16, served only within the gate "
                           "(docs/results/2026-11-23-precision-ladder/)")
OPENVINO_INT8_BF16_WHY = ("the layers NNCF left in floating point run in bf16 only with avx512_bf16/amx_bf16; without "
                          "them OpenVINO runs them in f32 and it is openvino-int8 again (docs/results/2026-11-23-precision-ladder/)")
OPENVINO_BF16_WHY = ("without avx512_bf16/amx_bf16 OpenVINO ignores the bf16 hint and runs f32 (read back on an AVX2 "
                     f"CPU); with them it runs well ahead of fp32 ({MEASURED})")
# A detector's networks in bf16 (docs/results/2026-11-26-detection-exports/mtcnn.md#reduced-precision has its measurements).
BACKBONE_BF16_RANK = ("just before scripted, its fp32 source: the gated candidates end at the first that runs "
                      "anywhere, so both ship and the load-time measurement weighs them; a detector's box-gated "
                      "variant, built only on a CPU that computes in bf16 (docs/results/2026-11-26-detection-exports/mtcnn.md)")
# XNNPACK's kernels fuse and sum in their own order, as ONNX Runtime's do: ONNX Runtime's tolerance.
EXECUTORCH_TOLERANCE = ONNX_TOLERANCE
# The device programs are built when named: they are for a phone or a board, lowering is one of the slower steps of
# an export (an int8 program's calibration and lowering take minutes on a small CPU), and on a server the ONNX and
# OpenVINO forms are the ones measured faster (docs/results/2026-11-28-executorch/). Ranked so that a server that
# has them measures them at load beside the others: the int8 program after onnx-int8, the fp32 one just after
# onnx-dynamo (a candidate where onnx-dynamo is not).
EXECUTORCH_OFF = ("a device program (docs/devices.md): its lowering is slow and a server has faster forms "
                  "(docs/results/2026-11-28-executorch/); built when named (its int8 comes with it under --precision)")
EXECUTORCH_WHY = "XNNPACK's CPU kernels through ExecuTorch's runtime; on a CUDA machine other forms serve"
# LiteRT's interpreter runs XNNPACK too: ONNX Runtime's tolerance. Its converter lives in an environment of its own
# (`make litert-env`: its pins would downgrade the serving stack's), so a server rarely has its runtime: never ranked.
LITERT_TOLERANCE = ONNX_TOLERANCE
LITERT_OFF = ("a device file (docs/devices.md) whose converter needs its own environment (make litert-env); built "
              "when named")
BACKBONE_BF16_WHY = ("oneDNN runs the bf16 convolutions natively only with avx512_bf16/amx_bf16; elsewhere they are "
                     "emulated, slower than fp32 (docs/results/2026-11-23-precision-ladder/)")


def register(kind: ArtifactKind) -> ArtifactKind:
    """Add a kind (a test adds one to prove a new backend needs no other edit)."""
    if kind.name in _TABLE:
        raise ValueError(f"artifact kind {kind.name!r} is registered twice")
    missing = [n for n in kind.needs + kind.sources if n not in _TABLE]
    if missing:
        raise ValueError(f"kind {kind.name} needs {', '.join(missing)}, which must be registered first")
    _TABLE[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    _TABLE.pop(name, None)


for _kind in (
    ArtifactKind(
        name="traced", file_name="model.traced.pt", format=TORCHSCRIPT, exporter="torch.jit.trace",
        input_sizes=EXAMPLE_SIZE, serving_rank=50,
        rank_reason="TorchScript last, and the trace after the script: a trace records the one path its example "
                    "took",
        tolerance=TORCHSCRIPT_TOLERANCE, build=exporters.trace),
    ArtifactKind(
        name="scripted", file_name="model.scripted.pt", format=TORCHSCRIPT, exporter="torch.jit.script",
        input_sizes=MODEL_SIZES, serving_rank=40,
        rank_reason="TorchScript runs eager's own kernels (tight tolerance) but behind ONNX Runtime in speed",
        tolerance=TORCHSCRIPT_TOLERANCE, build=exporters.script),
    ArtifactKind(
        name="exported", file_name="model.exported.pt2", format=TORCH_EXPORT,
        exporter="torch.export.export + torch.export.save (ExportedProgram)", input_sizes=MODEL_SIZES, serving_rank=35,
        rank_reason="torch.export is TorchScript's maintained successor: eager's own kernels (tight tolerance), "
                    "control flow kept as torch.cond; behind ONNX Runtime in speed (an interpreted graph), so "
                    "after it",
        tolerance=EXPORTED_PROGRAM_TOLERANCE, build=torch_export.exported_program),
    ArtifactKind(
        name="aotinductor", file_name="model.aoti.pt2", format=AOTI,
        exporter="AOTInductor (torch._inductor.aot_compile, packaged with the torch build it needs)",
        input_sizes=EXAMPLE_SIZE, serving_rank=25,
        rank_reason="compiled ahead of time to this machine's code, ahead of the interpreted torch forms; after the "
                    "ONNX forms that keep the graph's control flow: a package runs only under the torch build and "
                    "CPU instruction set (or GPU) that compiled it",
        tolerance=AOTINDUCTOR_TOLERANCE, build=torch_export.aot_inductor,
        off_by_default="its C++ compile is the slowest step of an export (docs/results/2026-11-24-aoti-tuning-resnet50/analysis.md) and the package is "
                       "pinned to this torch build and CPU: built when asked for",
        announce="compiling with AOTInductor (C++, the slowest step of an export)"),
    ArtifactKind(
        name="onnx-traced", file_name="model.traced.onnx", format=ONNX,
        exporter="torch.onnx.export(dynamo=False) of the traced module", input_sizes=EXAMPLE_SIZE, serving_rank=30,
        rank_reason=f"{ONNX_RUNTIME_FIRST}; after the other exporters: it inherits the trace's one path",
        tolerance=ONNX_TOLERANCE, build=exporters.onnx_from_torchscript, needs=("traced",)),
    ArtifactKind(
        name="onnx-scripted", file_name="model.scripted.onnx", format=ONNX,
        exporter="torch.onnx.export(dynamo=False) of the scripted module", input_sizes=MODEL_SIZES, serving_rank=20,
        rank_reason=f"{ONNX_RUNTIME_FIRST}; keeps If/Loop from the script; the legacy exporter is frozen upstream",
        tolerance=ONNX_TOLERANCE, build=exporters.onnx_from_torchscript, needs=("scripted",)),
    ArtifactKind(
        name="onnx-dynamo", file_name="model.dynamo.onnx", format=ONNX,
        exporter="torch.onnx.export(dynamo=True) (torch.export)", input_sizes=MODEL_SIZES, serving_rank=10,
        rank_reason=f"{ONNX_RUNTIME_FIRST}; torch.export is the maintained exporter (control flow as If)",
        tolerance=ONNX_TOLERANCE, build=exporters.onnx_dynamo),
    ArtifactKind(
        name="openvino", file_name=OPENVINO_IR, companions=(OPENVINO_WEIGHTS,), format=OPENVINO,
        exporter="openvino.convert_model of the onnx-traced file + save_model(compress_to_fp16=False)",
        input_sizes=EXAMPLE_SIZE, serving_rank=15, rank_reason=OPENVINO_FP32_RANK,
        tolerance=OPENVINO_TOLERANCE, build=openvino_ir.ir_from_onnx, needs=("onnx-traced",), runs_on=Needs(CPU),
        fast_why=OPENVINO_FP32_WHY,
        off_by_default="behind ONNX Runtime's fp32 forms in the serving order, so never served as fp32 when they "
                       "are, and its int8 with NNCF's accuracy control is the slowest variant to make "
                       "(docs/results/2026-11-25-openvino-kinds/): built when named (its int8 and bf16 variants come with it under "
                       "--precision)"),
    ArtifactKind(
        name=EXECUTORCH, file_name="model.pte", companions=("model.executorch.json",), format=EXECUTORCH,
        exporter="torch.export -> executorch.exir.to_edge_transform_and_lower(XnnpackPartitioner) -> .pte",
        input_sizes=EXAMPLE_SIZE, serving_rank=12,
        rank_reason="just after onnx-dynamo: a device program, behind ONNX Runtime fp32 on the CPU measured "
                    "(docs/results/2026-11-28-executorch/); CPU only",
        tolerance=EXECUTORCH_TOLERANCE, build=executorch.lower, runs_on=Needs(CPU), fast_why=EXECUTORCH_WHY,
        off_by_default=EXECUTORCH_OFF, for_devices=True),
    ArtifactKind(
        name=LITERT, file_name="model.tflite", companions=("model.litert.json",), format=LITERT,
        exporter="litert_torch.convert (torch.export -> LiteRT's converter) -> .tflite", input_sizes=EXAMPLE_SIZE,
        serving_rank=None,
        rank_reason="a device file: its runtime lives in its own environment (make litert-env), which a server "
                    "seldom has; served only when asked (--serve)",
        tolerance=LITERT_TOLERANCE, build=litert.convert, runs_on=Needs(CPU),
        fast_why="XNNPACK's CPU kernels through LiteRT's interpreter; on a CUDA machine other forms serve",
        off_by_default=LITERT_OFF, for_devices=True),
    ArtifactKind(
        name="onnx-int8", file_name="model.int8.onnx", format=ONNX,
        exporter="onnxruntime.quantization.quantize_static (QDQ)", input_sizes=SOURCE_SIZES, serving_rank=5,
        rank_reason="after openvino-int8 (slower wherever both were measured), before openvino-bf16 (ahead of it at "
                    "one thread, batch 1) and every fp32 form (well ahead of ONNX Runtime fp32 with VNNI); served "
                    f"only within the accuracy gate ({MEASURED})",
        precision="int8", sources=ONNX_SOURCES, fast_on=Needs(CPU),
        fast_why="ONNX Runtime's int8 QDQ kernels are its CPU ones (on a GPU the fp32 forms run on CUDA instead); "
                 "without VNNI the gain depends on the model (ahead of fp32 on EfficientNet-Lite0, behind it on "
                 f"ResNet-50), where openvino-int8 is the int8 to build ({MEASURED})"),
    ArtifactKind(
        name="openvino-int8", file_name=OPENVINO_INT8_IR, companions=(OPENVINO_INT8_WEIGHTS,), format=OPENVINO,
        exporter="nncf.quantize of the openvino IR (post-training, the calibration images)", input_sizes=SOURCE_SIZES,
        serving_rank=0, rank_reason=OPENVINO_INT8_RANK, precision="int8", sources=("openvino",), runs_on=Needs(CPU),
        fast_on=Needs(CPU), fast_why=OPENVINO_INT8_WHY),
    ArtifactKind(
        name="openvino-int8-bf16", file_name=OPENVINO_INT8_IR, companions=(OPENVINO_INT8_WEIGHTS,), format=OPENVINO,
        exporter="the openvino-int8 IR compiled with INFERENCE_PRECISION_HINT bf16 (no second quantization)",
        input_sizes=SOURCE_SIZES, serving_rank=2, rank_reason=OPENVINO_INT8_BF16_RANK, precision="int8",
        run_precision="bf16", sources=("openvino",), needs=("openvino-int8",), runs_on=Needs(CPU),
        fast_on=Needs(CPU, (BF16_FLAGS,)), fast_why=OPENVINO_INT8_BF16_WHY),
    ArtifactKind(
        name="openvino-bf16", file_name=OPENVINO_IR, companions=(OPENVINO_WEIGHTS,), format=OPENVINO,
        exporter="the openvino IR compiled with INFERENCE_PRECISION_HINT bf16", input_sizes=SOURCE_SIZES,
        serving_rank=8, rank_reason=OPENVINO_BF16_RANK, precision="bf16", run_precision="bf16", sources=("openvino",),
        runs_on=Needs(CPU), fast_on=Needs(CPU, (BF16_FLAGS,)), fast_why=OPENVINO_BF16_WHY),
    ArtifactKind(
        name="executorch-int8", file_name="model.int8.pte", companions=("model.int8.executorch.json",),
        format=EXECUTORCH, exporter="torchao PT2E (XNNPACKQuantizer, per channel) on the calibration images -> "
        "to_edge_transform_and_lower(XnnpackPartitioner) -> .pte", input_sizes=SOURCE_SIZES, serving_rank=6,
        rank_reason="after onnx-int8 and before openvino-bf16: a device program, measured at load beside the server "
                    "int8 forms (docs/results/2026-11-28-executorch/); served only within the accuracy gate",
        precision="int8", sources=(EXECUTORCH,), runs_on=Needs(CPU), fast_on=Needs(CPU), fast_why=EXECUTORCH_WHY,
        for_devices=True),
    ArtifactKind(
        name="onnx-fp16", file_name="model.fp16.onnx", format=ONNX, exporter="onnxruntime.transformers.float16",
        input_sizes=SOURCE_SIZES, serving_rank=None,
        rank_reason="fast only on a GPU, which the exporting machine may not be: served when asked (--serve)",
        precision="fp16", sources=ONNX_SOURCES, runs_on=Needs(CUDA)),
    ArtifactKind(
        name="scripted-bf16", file_name="model.scripted.pt", format=TORCHSCRIPT,
        exporter="torch.autocast(bfloat16) around the scripted module", input_sizes=SOURCE_SIZES, serving_rank=None,
        rank_reason="fast only on CPUs with native bf16: served when asked (--serve)",
        precision="bf16", run_precision="bf16", sources=("scripted",), fast_on=Needs(cpu_any=(BF16_FLAGS,)),
        fast_why="PyTorch's CPU autocast emulates bf16 without avx512_bf16/amx_bf16, many times slower than fp32"),
    ArtifactKind(
        name="scripted-bf16-backbone", file_name="model.bf16-backbone.scripted.pt", format=TORCHSCRIPT,
        exporter="torch.jit.script of the model with every Conv2d and Linear in bf16 between fp32 tensors "
                 "(channels_last); boxes, NMS and crops stay fp32 (export/precision/backbone.py)",
        input_sizes=SOURCE_SIZES, serving_rank=38, rank_reason=BACKBONE_BF16_RANK, precision="bf16",
        sources=("scripted",), fast_on=Needs(CPU, (BF16_FLAGS,)), fast_why=BACKBONE_BF16_WHY, task=DETECTION),
    ArtifactKind(
        name="scripted-fp16", file_name="model.scripted.pt", format=TORCHSCRIPT,
        exporter="torch.autocast(float16) around the scripted module", input_sizes=SOURCE_SIZES, serving_rank=None,
        rank_reason="fast only on a GPU: served when asked (--serve)",
        precision="fp16", run_precision="fp16", sources=("scripted",), runs_on=Needs(CUDA)),
):
    register(_kind)


def get(name: str) -> ArtifactKind:
    try:
        return _TABLE[name]
    except KeyError:
        raise ExportError(f"unknown artifact kind {name!r}; kinds: {', '.join(_TABLE)}") from None


def all_kinds() -> list[ArtifactKind]:
    return list(_TABLE.values())


def names() -> list[str]:
    return list(_TABLE)


def fp32_kinds() -> list[ArtifactKind]:
    """Every kind the pipeline can build, in table order (a kind's needs come before it)."""
    return [k for k in _TABLE.values() if not k.is_variant]


def default_formats() -> list[str]:
    """What an export builds without --formats: every fp32 kind but those off by default (each says why)."""
    return [k.name for k in fp32_kinds() if not k.off_by_default]


def chosen_formats(requested: list[str] | None, also: str | None = None) -> list[str]:
    """The fp32 kinds to build, in table order: the requested ones (None: the default), `also` (the kind asked
    for with --serve, when it is an fp32 kind) and the kinds they are made from. An unknown or
    reduced-precision name is an error naming the choices."""
    requested = list(default_formats() if requested is None else requested)
    if also in _TABLE and not _TABLE[also].is_variant:
        requested.append(also)
    wanted = set()
    for name in requested:
        kind = _TABLE.get(name)
        if kind is None or kind.is_variant:
            raise ExportError(f"--formats: {name!r} is not an fp32 artifact kind; choose from "
                              f"{', '.join(k.name for k in fp32_kinds())} (reduced precision: --precision)")
        wanted.add(name)
        wanted.update(_needed_by(kind))
    return [k.name for k in fp32_kinds() if k.name in wanted]


def opt_in_source_missing(kind: ArtifactKind, built) -> bool:
    """A variant made only from kinds that are off by default (the OpenVINO IR: its int8 with accuracy control
    is slow to make), none of which was built: not made, and not a refusal either."""
    return not set(kind.sources) & set(built) and all(_TABLE[s].off_by_default for s in kind.sources)


def _needed_by(kind: ArtifactKind) -> set[str]:
    needed = set(kind.needs)
    for name in kind.needs:
        needed |= _needed_by(_TABLE[name])
    return needed


def variants(precision: str) -> list[ArtifactKind]:
    return [k for k in _TABLE.values() if k.precision == precision]


def precisions() -> tuple[str, ...]:
    return tuple(dict.fromkeys([FP32] + [k.precision for k in _TABLE.values()]))


def serving_preference() -> tuple[str, ...]:
    ranked = [k for k in _TABLE.values() if k.serving_rank is not None]
    return tuple(k.name for k in sorted(ranked, key=lambda k: k.serving_rank))


def estimated_bytes(parameter_bytes: int, formats: list[str] | None = None) -> int:
    """Disk an export needs: each fp32 file is about the size of the parameters and buffers."""
    chosen = set(formats or names())
    return len({k.file_name for k in fp32_kinds() if k.name in chosen}) * parameter_bytes
