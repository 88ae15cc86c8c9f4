"""Accuracy-aware int8, in the spirit of NNCF's `quantize_with_accuracy_control`: when the int8 model fails the
accuracy gate, the nodes that do the most damage are put back in fp32, one at a time, until the calibration
images pass a stricter target (SELECTION_SHARE) or MAX_FP32_NODES is reached. The held-out images then judge the
result once, against the gate's own tolerance.

What "in fp32" means here (NNCF's meaning): the node reads its weights, bias and input activations unquantized;
its output is quantized only if its consumer is. ONNX Runtime's `nodes_to_exclude` alone does not give that:
the excluded node still sits between Q/DQ pairs, and since ORT 1.2x the session's WeightBiasQuantization
transformer quantizes such a node's float weights back to int8 at load, per tensor, which for a depthwise
convolution is worse than the per-channel int8 it replaced (measured on lite0: docs/results/2026-11-24-int8-efficientnet-lite0/). So
the QDQ graph is edited instead: the node's inputs are re-pointed at the
fp32 tensors behind their Q/DQ pairs (`revert_to_fp32`), which that transformer does not match.

Ranking: each node's damage is the logit error of a model where only that node is int8 (everything else fp32),
measured on every RANKING_STRIDE-th calibration image (never the held-out ones). The opposite test ("all int8
but this node") misses interactions: on lite0 the stem convolution looked harmless that way (the error left
behind by the others hid it) while alone it is among the most damaging (docs/results/2026-11-24-int8-efficientnet-lite0/).
Why not the cheaper SQNR ranking (export/divergence/int8.py): on lite0 the two mostly agree, but SQNR is
energy-weighted and cumulative, so it misses the small-channel damage of the depthwise convolutions: with its top
nodes in fp32 the held-out gate failed at every count tried, with this ranking's it passed (same document).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from export.precision.gate import TOLERANCE_BY_PRECISION, GateTolerance, judge
from gates.topk import agreement_metrics

RANKED_OPS = ("Conv", "Gemm", "MatMul", "Add")  # nodes with their own weights or their own quantized inputs
ACTIVATIONS = ("Relu", "Clip")  # kept explicit (QDQKeepRemovableActivations) so a reverted node keeps its clip
QUANTIZE_OPTIONS = {"QDQKeepRemovableActivations": True}
# About a fifth of lite0's ranked nodes: past that, fp32 islands and their Q/DQ transitions leave little of the
# int8 speed-up (measured: docs/results/2026-11-24-int8-efficientnet-lite0/), and a model that needs more is better served in fp32.
MAX_FP32_NODES = 12
RANKING_STRIDE = 4  # every 4th calibration image: ranking runs every node, so it sees a quarter of them
FP32_SUFFIX = "_fp32"
# The nodes are ranked and counted on the calibration images, so a pass on them is optimistic: a count that only
# just passed them passed the held-out images on one CPU and failed them on another (docs/results/2026-11-24-int8-efficientnet-lite0/).
# So the fallback aims at SELECTION_SHARE of each allowed disagreement, error and drop on the calibration images,
# and the held-out images keep the gate's full tolerance.
SELECTION_SHARE = 0.5


def selection_tolerance(tolerance: GateTolerance, share: float = SELECTION_SHARE) -> GateTolerance:
    """`tolerance` with `share` of each allowed shortfall: 98 % agreement (2 % allowed off) becomes 99 %."""
    return GateTolerance(min_top1_agreement=1 - share * (1 - tolerance.min_top1_agreement),
                         min_top5_agreement=1 - share * (1 - tolerance.min_top5_agreement),
                         max_relative_logit_error=share * tolerance.max_relative_logit_error,
                         max_accuracy_drop_points=share * tolerance.max_accuracy_drop_points)


@dataclass
class FallbackStep:
    fp32_nodes: int
    calibration_gate: dict  # the verdict against the selection target, and the metrics, on the calibration images
    images_per_s: float | None = None
    gate_passed: bool = False  # whether the same metrics are within the gate's own tolerance
    met_target: bool = False  # whether they met the selection target


@dataclass
class Fallback:
    ranking: list[dict]  # node, kind, damage (relative logit error when only it is int8)
    steps: list[FallbackStep] = field(default_factory=list)
    fp32_nodes: list[dict] = field(default_factory=list)
    passed_on_calibration: bool = False
    limit: int = MAX_FP32_NODES
    seconds: float = 0.0
    target: GateTolerance | None = None
    stopped_because: str = ""

    def record(self) -> dict:
        return {"fp32_nodes": self.fp32_nodes, "passed_on_calibration": self.passed_on_calibration,
                "selection_target": self.target and {"share_of_tolerance": SELECTION_SHARE, **asdict(self.target)},
                "stopped_because": self.stopped_because,
                "limit_max_fp32_nodes": self.limit, "ranking_images": f"every {RANKING_STRIDE}th calibration image",
                "ranking_top": self.ranking[:2 * self.limit],
                "steps": [{"fp32_nodes": s.fp32_nodes, "images_per_s_batch1": s.images_per_s,
                           "within_gate_tolerance": s.gate_passed, **s.calibration_gate} for s in self.steps],
                "seconds": round(self.seconds, 1)}


# ---------------------------------------------------------------- the graph edit

def node_kind(node, initializers: dict) -> str:
    """depthwise conv | conv | gemm | matmul | add: what the report names each node by."""
    if node.op_type != "Conv":
        return node.op_type.lower()
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    weight = initializers.get(node.input[1])
    channels = weight.dims[0] if weight is not None else None
    return "depthwise conv" if group > 1 and group == channels else "conv"


def ranked_nodes(prepared) -> dict[str, str]:
    """name -> kind for every node the ranking considers, in graph order."""
    initializers = {i.name: i for i in prepared.graph.initializer}
    return {n.name: node_kind(n, initializers) for n in prepared.graph.node if n.op_type in RANKED_OPS}


def revert_to_fp32(qdq, prepared, names: set[str]):
    """A copy of the QDQ model where `names` (and the Relu/Clip right after each) read fp32 weights, bias and
    input activations. `prepared` is the fp32 model quantize_static was given (same node names)."""
    model = copy.deepcopy(qdq)
    graph = model.graph
    originals = {n.name: n for n in prepared.graph.node}
    fp32_initializers = {i.name: i for i in prepared.graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    for node in _with_activations(graph, names):
        original = originals.get(node.name)
        for position, name in enumerate(node.input):
            source = original.input[position] if original is not None else None
            if source in fp32_initializers:
                node.input[position] = _add_fp32_initializer(graph, fp32_initializers[source])
            else:
                node.input[position] = _behind_qdq(name, producer)
    _drop_unused(graph)
    return model


def _with_activations(graph, names: set[str]) -> list:
    """The named nodes and the activation each feeds through one Q/DQ pair: reverting a convolution without
    its ReLU6 would quantize between the two."""
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    chosen = [n for n in graph.node if n.name in names]
    for node in list(chosen):
        for quantize in consumers.get(node.output[0], []):
            for dequantize in consumers.get(quantize.output[0], []) if quantize.op_type == "QuantizeLinear" else []:
                chosen += [c for c in consumers.get(dequantize.output[0], []) if c.op_type in ACTIVATIONS]
    return chosen


def _behind_qdq(name: str, producer: dict) -> str:
    """x for DequantizeLinear(QuantizeLinear(x)), else name unchanged."""
    dequantize = producer.get(name)
    if dequantize is None or dequantize.op_type != "DequantizeLinear":
        return name
    quantize = producer.get(dequantize.input[0])
    return quantize.input[0] if quantize is not None and quantize.op_type == "QuantizeLinear" else name


def _add_fp32_initializer(graph, original) -> str:
    """The fp32 original under its own name (the quantized graph may reuse the original name for a DQ output)."""
    import onnx
    name = original.name + FP32_SUFFIX
    if not any(i.name == name for i in graph.initializer):
        tensor = onnx.TensorProto()
        tensor.CopyFrom(original)
        tensor.name = name
        graph.initializer.append(tensor)
    return name


def _drop_unused(graph) -> None:
    """Q/DQ nodes and quantized initializers nothing reads any more."""
    while True:
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        dead = [node for node in graph.node if not any(output in used for output in node.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


# ---------------------------------------------------------------- ranking and the loop

def session_run(model, images: torch.Tensor, batch: int = 16) -> torch.Tensor:
    """Logits of an in-memory model through ONNX Runtime with the serving runtime's session options."""
    import onnxruntime as ort

    from runtime.onnxruntime import session_options
    session = ort.InferenceSession(model.SerializeToString(), sess_options=session_options(0),
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return torch.cat([torch.from_numpy(session.run(None, {name: images[i:i + batch].numpy()})[0])
                      for i in range(0, len(images), batch)])


def rank_by_damage(qdq, prepared, images: torch.Tensor, reference: torch.Tensor) -> list[dict]:
    """Every ranked node's damage: the relative logit error when only it is int8, minus that of no ranked node
    int8 (what the unranked Q/DQ, e.g. the input's, cost anyway). Most damaging first."""
    kinds = ranked_nodes(prepared)
    everything = set(kinds)
    floor = _error(revert_to_fp32(qdq, prepared, everything), images, reference)
    ranking = [{"node": name, "kind": kind,
                "damage": round(_error(revert_to_fp32(qdq, prepared, everything - {name}), images, reference)
                                - floor, 5)}
               for name, kind in kinds.items()]
    return sorted(ranking, key=lambda row: row["damage"], reverse=True)


def _error(model, images: torch.Tensor, reference: torch.Tensor) -> float:
    return agreement_metrics(reference, session_run(model, images))["relative_logit_error"]


@dataclass
class FallbackInputs:
    """What the fallback edits and judges: the QDQ model (activations kept explicit), the fp32 graph it was
    quantized from, the calibration images and the fp32 source's logits on them."""

    qdq: object  # onnx.ModelProto
    prepared: object  # onnx.ModelProto
    images: torch.Tensor
    reference: torch.Tensor


def fall_back(inputs: FallbackInputs, kind, speed, progress, limit: int = MAX_FP32_NODES):
    """Put the most damaging nodes back in fp32 one at a time until the calibration images meet the selection
    target of `kind`'s gate (its name and precision), or `limit` nodes are fp32; in that case the fewest nodes
    that met the gate's own tolerance, if any count did. speed(model) -> batch-1 images/s. Returns (model,
    Fallback)."""
    started = time.perf_counter()
    qdq, prepared, images, reference = inputs.qdq, inputs.prepared, inputs.images, inputs.reference
    ranking = rank_by_damage(qdq, prepared, images[::RANKING_STRIDE], reference[::RANKING_STRIDE])
    target = selection_tolerance(TOLERANCE_BY_PRECISION[kind.precision])
    fallback = Fallback(ranking, limit=limit, target=target)
    progress.step(f"int8 fallback: ranked {len(ranking)} nodes by damage; worst: " +
                  ", ".join(f"{r['node']} ({r['kind']}, {r['damage']:.3f})" for r in ranking[:3]))

    def reverted(count: int):
        return revert_to_fp32(qdq, prepared, {r["node"] for r in ranking[:count]})

    for count in range(1, min(limit, len(ranking)) + 1):
        model = reverted(count)
        logits = session_run(model, images)
        aimed = judge(kind.name, kind.precision, reference, logits, tolerance=target)
        within = judge(kind.name, kind.precision, reference, logits).passed
        fallback.steps.append(FallbackStep(count, _gate_summary(aimed), speed(model), within, aimed.passed))
        progress.step(f"int8 fallback: {count} fp32 node(s), calibration images: selection target "
                      f"{aimed.verdict}" + ("" if aimed.passed else f" (gate's own tolerance: "
                                                                    f"{'met' if within else 'not met'})"))
        if aimed.passed:
            break
    if not fallback.steps:  # no node of RANKED_OPS: the plain int8 model goes to the held-out gate as it is
        fallback.stopped_because = f"no {'/'.join(RANKED_OPS)} node to put back in fp32"
        return qdq, fallback
    chosen, fallback.stopped_because = chosen_count(fallback.steps, limit)
    fallback.passed_on_calibration = fallback.steps[chosen - 1].gate_passed
    fallback.fp32_nodes = ranking[:chosen]
    if chosen != len(fallback.steps):  # the last model tried is not the one kept: edit the graph again
        model = reverted(chosen)
    fallback.seconds = time.perf_counter() - started
    return model, fallback


def chosen_count(steps: list[FallbackStep], limit: int) -> tuple[int, str]:
    """(fp32 nodes kept, why): the last step when it met the selection target (or when no step met even the
    gate's tolerance: the most nodes tried, for the held-out judgement to refuse), else the fewest nodes within
    the gate's own tolerance."""
    last = steps[-1]
    if last.met_target:
        return last.fp32_nodes, "the calibration images met the selection target"
    within = [s.fp32_nodes for s in steps if s.gate_passed]
    why = f"limit of {limit} fp32 nodes reached without meeting the selection target; "
    if within:
        return within[0], why + f"kept the fewest nodes within the gate's own tolerance ({within[0]})"
    return last.fp32_nodes, why + "no count met even the gate's own tolerance"


def _gate_summary(gate) -> dict:
    keys = ("top1_agreement", "top1_agreement_confident", "confident_images", "top5_agreement",
            "relative_logit_error")
    return {"verdict": gate.verdict, **{k: round(gate.metrics[k], 4) for k in keys if k in gate.metrics}}


def save(model, path: Path) -> None:
    import onnx
    onnx.save(model, str(path))
