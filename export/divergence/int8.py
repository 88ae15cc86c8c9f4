"""Where an int8 QDQ model departs from its fp32 ONNX source: the SQNR of every quantized tensor against the same
tensor of the fp32 model on the same images (ONNX Runtime's own qdq_loss_debug), each tensor named by the node
that makes it in the int8 graph, that node's PyTorch module path and the model's source line.

The SQNR of a tensor is cumulative: it counts the error of everything upstream, so it falls along the graph and
the lowest values sit near the logits. What locates the damage is the first tensor below SQNR_FLOOR_DB in graph
order, and `drop_db`, the SQNR a node loses against the worst of its own inputs.

Module paths: torch.export-based ONNX nodes carry `pkg.torch.onnx.name_scopes` and `pkg.torch.onnx.stack_trace`;
the TorchScript-based exporter keeps only the scope in the node name ("/network/blocks/0/depthwise/0/Conv") and
no source line, which eager PyTorch supplies when the module is given (the line that called that module).
"""

from __future__ import annotations

import ast
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from export.divergence.taps import call_key, keep_all, last_model_frame, short_source
from export.errors import ExportError
from export.precision.int8_fallback import ACTIVATIONS, RANKED_OPS, node_kind

# About what 8-bit rounding of a ReLU6 range leaves a typical activation using ~6 of its 8 bits (6 * 6.02 - 11
# dB); on lite0's plain int8 the stem stays above it and the first depthwise convolution, the fallback's most
# damaging node, is the first below (docs/results/2026-11-24-int8-efficientnet-lite0/). Not yet checked on a model with trained weights
# that passes the gate plainly (no trained resnet installs offline).
SQNR_FLOOR_DB = 25.0
MAX_IMAGES = 8  # the tool keeps every tensor of every image of both models in memory
BATCH = 4
TABLE_ROWS = 10
RANKING_TOP = 8
_QUANTIZED_OUTPUT = "_DequantizeLinear_Output"


class Int8DivergenceError(ExportError):
    """The int8 model and its fp32 source cannot be compared tensor by tensor."""


@dataclass
class SqnrRow:
    tensor: str  # the tensor's name, the same in both models
    node: str  # the int8 graph's node that makes it (the fp32 source's name for it)
    op: str
    kind: str  # int8_fallback.node_kind: conv | depthwise conv | gemm | add | clip ...
    key: str  # the PyTorch module that made it, "@k" for its (k+1)-th call ("" when the exporter kept none)
    source: str  # "file:line" of the model's code that called it ("" when the exporter kept none)
    sqnr_db: float  # fp32 tensor vs the int8 model's dequantized tensor, cumulative
    drop_db: float  # SQNR lost at this node: the lowest SQNR among its inputs minus its own

    def where(self) -> str:
        place = ", ".join(filter(None, (self.op + (f", {self.kind}" if self.kind != self.op.lower() else ""),
                                        short_source(self.source))))
        return f"{self.key or self.node} ({place})"


@dataclass
class Int8Divergence:
    rows: list[SqnrRow]  # graph order
    images: int
    floor_db: float = SQNR_FLOOR_DB
    ranking: dict | None = None  # compare_rankings() against the int8 fallback's own, when its record is given
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> SqnrRow | None:
        return next((r for r in self.rows if r.sqnr_db < self.floor_db), None)

    @property
    def worst(self) -> list[SqnrRow]:
        return sorted(self.rows, key=lambda r: r.sqnr_db)[:TABLE_ROWS]

    def line(self) -> str:
        first = self.first
        if first is None:
            return f"onnx-int8: every tensor at or above {self.floor_db:g} dB SQNR"
        return f"onnx-int8: SQNR first below {self.floor_db:g} dB at {first.where()}: {first.sqnr_db:.1f} dB"

    def markdown(self) -> str:
        first = self.first
        summary = (f"{len(self.rows)} quantized tensors compared on {self.images} image(s) (ONNX Runtime's "
                   f"qdq_loss_debug); floor {self.floor_db:g} dB.")
        lines = ["## onnx-int8: SQNR against the fp32 source", "", summary, "", f"**{self.line()}**", ""]
        if first is not None:
            start = self.rows.index(first)
            lines += ["From there on:", "", *_table(self.rows[start:start + TABLE_ROWS]), ""]
        lines += ["Lowest SQNR:", "", *_table(self.worst)]
        if self.ranking:
            lines += ["", _ranking_line(self.ranking)]
        return "\n".join(lines + [f"\n{note}" for note in self.notes]) + "\n"

    def as_dict(self) -> dict:
        first = self.first
        return {"floor_db": self.floor_db, "images": self.images, "line": self.line(),
                "first": first and asdict(first), "worst": [asdict(r) for r in self.worst],
                "rows": [asdict(r) for r in self.rows], "ranking": self.ranking, "notes": self.notes}


def _table(rows: list[SqnrRow]) -> list[str]:
    return ["| module | node | op | source | SQNR dB | drop dB |", "|---|---|---|---|---|---|",
            *[f"| {r.key or '-'} | {r.node} | {r.op}{f' ({r.kind})' if r.kind != r.op.lower() else ''} | "
              f"{short_source(r.source) or '-'} | {r.sqnr_db:.1f} | {r.drop_db:.1f} |" for r in rows]]


def _ranking_line(ranking: dict) -> str:
    same = "the same node" if ranking["same_first"] else "different nodes"
    return (f"Against the int8 fallback's damage ranking: both put {same} first (SQNR drop: "
            f"{ranking['sqnr_first']}; damage: {ranking['damage_first']}); top-{ranking['top']} overlap "
            f"{ranking['overlap']}/{ranking['top']}, Spearman {ranking['spearman']}.")


# ---------------------------------------------------------------- the entry point

def explain_int8(fp32_path: Path, int8_path: Path, images: torch.Tensor, fallback_record: dict | None = None,
                 module: torch.nn.Module | None = None, floor_db: float = SQNR_FLOOR_DB) -> Int8Divergence:
    """SQNR of every quantized tensor of `int8_path` (QDQ) against `fp32_path` (the ONNX it was quantized from) on
    `images` (N x C x H x W float32, preprocessed; the first MAX_IMAGES are used). `module`, the eager model,
    supplies source lines the exporter did not keep; `fallback_record`, what the manifest stores at the int8
    artifact's `details["made_by"]["fp32_fallback"]` (int8_fallback.Fallback.record(), JSON round-tripped or
    not; see damage_ranking for the other shapes read), adds a comparison of the two rankings."""
    import onnx
    images = _checked(images)
    fp32, int8 = onnx.load(str(fp32_path)), onnx.load(str(int8_path))
    sqnr = sqnr_by_tensor(Path(fp32_path), Path(int8_path), images, _input_name(fp32))
    if not sqnr:
        raise Int8DivergenceError(f"no quantized tensor of {int8_path} has a namesake in {fp32_path}: give the "
                                  "fp32 ONNX the int8 model was quantized from (its tensor names must survive)")
    eager = _eager_sources(module, images) if module is not None else {}
    rows = _rows(fp32, int8, sqnr, eager)
    result = Int8Divergence(rows, len(images), floor_db)
    damage = damage_ranking(fallback_record) if fallback_record else []
    if damage:
        result.ranking = compare_rankings(rows, damage)
    elif fallback_record:
        result.notes.append("The fallback record given holds no damage ranking (no ranking_top, fp32_nodes or "
                            "nodes); the rankings are not compared.")
    if not any(r.source for r in rows):
        result.notes.append("The fp32 source kept no source lines (TorchScript-based ONNX); pass the eager module.")
    return result


def _checked(images: torch.Tensor) -> torch.Tensor:
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise Int8DivergenceError(f"images must be an N x C x H x W float tensor, got "
                                  f"{getattr(images, 'shape', type(images))}; pass preprocessed images")
    return images[:MAX_IMAGES].to(torch.float32).contiguous()


def _input_name(model) -> str:
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise Int8DivergenceError(f"the fp32 ONNX takes {len(inputs)} inputs ({inputs}); the SQNR report feeds "
                                  "one image batch, so it explains single-input models only")
    return inputs[0]


# ---------------------------------------------------------------- ONNX Runtime's tool

def sqnr_by_tensor(fp32_path: Path, int8_path: Path, images: torch.Tensor, input_name: str) -> dict[str, dict]:
    """tensor -> {"sqnr_db": fp32 vs the int8 model's dequantized value}, for every quantized activation with a
    namesake in the fp32 model. The augmented models (every tensor made an output) live in a temporary folder."""
    from onnxruntime.quantization import qdq_loss_debug as debug
    batches = [{input_name: images[i:i + BATCH].numpy()} for i in range(0, len(images), BATCH)]
    with tempfile.TemporaryDirectory(prefix="int8-sqnr-") as folder:
        activations = {}
        for role, path in (("fp32", fp32_path), ("int8", int8_path)):
            augmented = str(Path(folder) / f"{role}.onnx")
            debug.modify_model_output_intermediate_tensors(str(path), augmented)
            activations[role] = debug.collect_activations(augmented, batches)
    matched = debug.create_activation_matching(activations["int8"], activations["fp32"])
    matched = {name: match for name, match in matched.items() if match.get("float")}
    errors = debug.compute_activation_error(matched)
    return {name: {"sqnr_db": round(float(error["xmodel_err"]), 2)} for name, error in errors.items()}


# ---------------------------------------------------------------- rows: node, module, source

def _rows(fp32, int8, sqnr: dict[str, dict], eager: dict[str, str]) -> list[SqnrRow]:
    """One row per compared tensor, in the int8 graph's order, named by the int8 node that makes it (after
    quantization a Conv writes its fused ReLU6's tensor) as the fp32 source spells that node. Where the
    activation was kept explicit (QDQKeepRemovableActivations, the fallback's graph), the Q/DQ after a Conv or
    Gemm takes its only consumer's Relu/Clip range, so the conv's own tensor (negatives included in fp32) is not
    compared; the activation's output is, under the conv's name."""
    fp32_nodes = {n.name: n for n in fp32.graph.node}
    fp32_producer = {o: n for n in fp32.graph.node for o in n.output}
    initializers = {i.name: i for i in fp32.graph.initializer}
    behind_qdq = _quantized_inputs(int8)
    int8_nodes = {n.name: n for n in int8.graph.node}
    conv_of = _activated_convs(int8)  # activation node name -> the Conv/Gemm node it alone follows
    skipped = {c.name for c in conv_of.values()}
    rows = []
    for node in int8.graph.node:
        if node.name in skipped:
            continue
        for tensor in (t for t in node.output if t in sqnr):
            conv = conv_of.get(node.name)
            if conv is not None:
                source_node = fp32_nodes.get(conv.name) or fp32_producer.get(conv.output[0], conv)
            else:
                source_node = fp32_nodes.get(node.name) or fp32_producer[tensor]  # a graph output's maker is a DQ
            key, source = node_origin(source_node)
            maker = conv if conv is not None else int8_nodes.get(source_node.name, node)
            inputs = [sqnr[t]["sqnr_db"] for t in behind_qdq(maker) if t in sqnr]
            db = sqnr[tensor]["sqnr_db"]
            rows.append(SqnrRow(tensor, source_node.name, source_node.op_type, node_kind(source_node, initializers),
                                key, source or eager.get(key, ""), db, round(min(inputs) - db, 2) if inputs else 0.0))
    return rows


_ACTIVATED = ("Conv", "Gemm")


def _activated_convs(int8) -> dict:
    """activation node name -> Conv/Gemm node, where the conv's output goes (through one Q/DQ pair, or directly)
    to that Relu/Clip alone: the explicit-activation QDQ graph."""
    consumers: dict[str, list] = {}
    for node in int8.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in int8.graph.output}

    def only(tensor: str):
        readers = consumers.get(tensor, [])
        return readers[0] if len(readers) == 1 and tensor not in outputs else None

    found = {}
    for node in (n for n in int8.graph.node if n.op_type in _ACTIVATED):
        reader = only(node.output[0])
        if reader is not None and reader.op_type == "QuantizeLinear":
            dequantize = only(reader.output[0])
            reader = only(dequantize.output[0]) if dequantize is not None and \
                dequantize.op_type == "DequantizeLinear" else None
        if reader is not None and reader.op_type in ACTIVATIONS:
            found[reader.name] = node
    return found


def _quantized_inputs(int8):
    """node -> the fp32 tensor names behind its inputs' DequantizeLinear(QuantizeLinear(x)) pairs."""
    producer = {o: n for n in int8.graph.node for o in n.output}

    def behind(node) -> list[str]:
        names = []
        for name in node.input:
            dequantize = producer.get(name)
            quantize = producer.get(dequantize.input[0]) if dequantize is not None else None
            if dequantize is not None and dequantize.op_type == "DequantizeLinear" and quantize is not None:
                names.append(quantize.input[0])
            elif name.endswith(_QUANTIZED_OUTPUT):
                names.append(name[:-len(_QUANTIZED_OUTPUT)])
        return names
    return behind


def node_origin(node) -> tuple[str, str]:
    """(module key, "file:line") of an ONNX node: torch.export's scopes and stack trace when present, else the
    TorchScript-based exporter's node name ("/layer1/0/relu_1/Relu" -> "layer1.0.relu@1", no line)."""
    meta = {p.key: p.value for p in node.metadata_props}
    if "pkg.torch.onnx.name_scopes" in meta:
        return _scoped_key(meta["pkg.torch.onnx.name_scopes"]), last_model_frame(meta.get("pkg.torch.onnx.stack_trace"))
    return legacy_key(node.name), ""


def _scoped_key(scopes: str) -> str:
    """"['', 'layer1', 'layer1.0', 'layer1.0.relu@1', 'relu_1']" -> "layer1.0.relu@1": the last scope before
    the op (torch.export spells a repeated call path@k itself)."""
    try:
        names = ast.literal_eval(scopes)
    except (ValueError, SyntaxError):
        return ""
    return names[-2] if isinstance(names, list) and len(names) >= 2 else ""


_REPEATED = re.compile(r"^(?P<name>.*[^_\d])_(?P<call>\d+)$")


def legacy_key(name: str) -> str:
    """"/network/blocks/0/depthwise/0/Conv" -> "network.blocks.0.depthwise.0"; a nested scope spelt in full
    ("/blocks/blocks.0/...") is taken once; the last scope's "_k" suffix is the (k+1)-th call."""
    path: list[str] = []
    for scope in (s for s in name.split("/")[1:-1] if s):
        nested = path and scope.startswith(path[-1] + ".")  # "blocks" then "blocks.0": one "blocks"
        path = path[:-1] + scope.split(".") if nested else path + scope.split(".")
    if not path:
        return ""
    repeated = _REPEATED.match(path[-1])
    if repeated and not repeated["name"].isdigit():
        return call_key(".".join(path[:-1] + [repeated["name"]]), int(repeated["call"]))
    return ".".join(path)


def _eager_sources(module: torch.nn.Module, images: torch.Tensor) -> dict[str, str]:
    """module key -> the line of the model's code that called it, from one eager forward pass."""
    from export.divergence.eager import EagerTaps
    taps = EagerTaps(module.eval()).taps(images[:1], keep_all)
    return {tap.key: tap.source for tap in taps if tap.source}


# ---------------------------------------------------------------- the two rankings

def damage_ranking(record: dict) -> list[dict]:
    """The fallback's damage ranking, most damaging first, as [{"node": ...}, ...], from what the manifest keeps:
    Fallback.record() (`ranking_top`: the first 2 x limit nodes ranked; else `fp32_nodes`: those put back), or
    the artifact record, its `details` or `made_by` holding it at `made_by.fp32_fallback`, or the int8_choice
    summary (`nodes`: "name (kind)" strings of the fp32 nodes)."""
    for outer in ("details", "made_by", "fp32_fallback"):
        if isinstance(record.get(outer), dict):
            return damage_ranking(record[outer])
    for key in ("ranking_top", "fp32_nodes"):
        rows = record.get(key)
        if rows:
            return [{"node": r["node"], **r} if isinstance(r, dict) else {"node": str(r)} for r in rows]
    return [{"node": re.sub(r" \([^()]*\)$", "", str(n))} for n in record.get("nodes") or []]


def compare_rankings(rows: list[SqnrRow], damage_ranking: list[dict], top: int = RANKING_TOP) -> dict:
    """The SQNR drop ranking (nodes of int8_fallback.RANKED_OPS, most SQNR lost first) against the fallback's
    damage ranking (`ranking_top` of its record): first of each, top-k overlap, Spearman over common nodes."""
    drops = sorted((r for r in rows if r.op in RANKED_OPS), key=lambda r: r.drop_db, reverse=True)
    by_sqnr = [r.node for r in drops]
    by_damage = [r["node"] for r in damage_ranking]
    common = [n for n in by_damage if n in by_sqnr]
    return {"top": top, "sqnr_first": by_sqnr[0] if by_sqnr else "", "damage_first": by_damage[0] if by_damage else "",
            "same_first": bool(by_sqnr and by_damage and by_sqnr[0] == by_damage[0]),
            "overlap": len(set(by_sqnr[:top]) & set(by_damage[:top])),
            "sqnr_top": by_sqnr[:top], "damage_top": by_damage[:top], "spearman": spearman(common, by_sqnr)}


def spearman(order_a: list[str], order_b: list[str]) -> float | None:
    """Spearman's rho of the items of order_a (their order there) against their relative order in order_b."""
    items = [n for n in order_a if n in order_b]
    if len(items) < 2:
        return None
    ranks_b = {n: i for i, n in enumerate(sorted(items, key=order_b.index))}
    count = len(items)
    squared = sum((i - ranks_b[n]) ** 2 for i, n in enumerate(items))
    return round(1 - 6 * squared / (count * (count * count - 1)), 3)
