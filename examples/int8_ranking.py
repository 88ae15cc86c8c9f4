"""The SQNR-drop ranking (export/divergence/int8.py) against the int8 fallback's damage ranking
(export/precision/int8_fallback.rank_by_damage) on EfficientNet-Lite0, as docs/results/2026-11-24-int8-efficientnet-lite0/ reports it:

    python -m examples.int8_ranking [--out DIR]

lite0 with its trained weights, exported as the pipeline's onnx-traced source, quant_pre_process, plain
quantize_static with build_int8's options (QUInt8) on the 100 default calibration images; `explain_int8` on the
first 8 held-out images; `rank_by_damage` on every RANKING_STRIDE-th calibration image (of the graph quantized
with the fallback's QUANTIZE_OPTIONS, as the fallback ranks); then each ranking's top 4/8/12 put back in fp32
(`revert_to_fp32`) and judged on the 128 held-out images with the onnx-int8 gate. Last, the report on the
fallback-made model (damage top 8 in fp32). Prints a table; --out keeps the ONNX files.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

COUNTS = (4, 8, 12)
CALIBRATION_IMAGES = 100
HOLDOUT_IMAGES = 128
FALLBACK_NODES = 8


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the ONNX files here (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        measure(args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="int8-ranking-") as folder:
            measure(Path(folder))


def measure(folder: Path) -> None:
    import onnx
    import onnxruntime
    from onnxruntime.quantization.shape_inference import quant_pre_process

    import models
    from export.divergence.int8 import compare_rankings, explain_int8
    from export.precision import int8_fallback as fallback
    from export.precision.calibration import ImageSet, default_images
    from export.precision.gate import judge
    from export.precision.onnx_int8 import Int8Work
    from export.precision.variants import INT8
    from models.efficientnet import weights_preprocessing

    started = time.perf_counter()
    module = models.entry_of("efficientnet", "lite0").build("imagenet").module.eval()
    contract = weights_preprocessing("lite0")
    calibration = default_images(contract, "calibration", CALIBRATION_IMAGES).images
    holdout = default_images(contract, "holdout", HOLDOUT_IMAGES).images
    fp32, prepared, plain, explicit = (folder / f"{n}.onnx" for n in ("fp32", "prepared", "int8", "explicit"))
    with torch.no_grad():
        torch.onnx.export(torch.jit.trace(module, calibration[:1]), (calibration[:1],), str(fp32), dynamo=False,
                          input_names=["input"], dynamic_axes={"input": {0: "batch"}})
    quant_pre_process(str(fp32), str(prepared))
    work = Int8Work(folder, prepared, folder / "ranges.json",
                     ImageSet(calibration, [f"#{i}" for i in range(len(calibration))], "default calibration"))
    work.quantize(plain, "QUInt8")
    work.quantize(explicit, "QUInt8", fallback.QUANTIZE_OPTIONS)
    print(f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}; lite0, {len(calibration)} "
          f"calibration / {len(holdout)} held-out images; threads {torch.get_num_threads()}")

    report = explain_int8(fp32, plain, holdout, module=module)
    print(f"\nplain int8: {report.line()}")
    print("  " + "; ".join(f"{r.key or r.node} {r.sqnr_db:.1f}" for r in report.rows[:4]))

    prepared_model, qdq = onnx.load(str(prepared)), onnx.load(str(explicit))
    reference = fallback.session_run(prepared_model, calibration)
    stride = fallback.RANKING_STRIDE
    ranking_started = time.perf_counter()
    damage = fallback.rank_by_damage(qdq, prepared_model, calibration[::stride], reference[::stride])
    ranking_s = time.perf_counter() - ranking_started
    ranked = fallback.ranked_nodes(prepared_model)
    drops = [r.node for r in sorted(report.rows, key=lambda r: r.drop_db, reverse=True) if r.node in ranked]
    compared = compare_rankings(report.rows, damage)
    print(f"\nrankings ({len(ranked)} ranked nodes; damage ranking {ranking_s:.0f} s on "
          f"{len(calibration[::stride])} images): first by SQNR drop {compared['sqnr_first']}, by damage "
          f"{compared['damage_first']}; top-{compared['top']} overlap {compared['overlap']}/{compared['top']}; "
          f"Spearman {compared['spearman']}")
    print("  damage top-4:    " + ", ".join(r["node"] for r in damage[:4]))
    print("  SQNR-drop top-4: " + ", ".join(drops[:4]))

    fp32_holdout = fallback.session_run(onnx.load(str(fp32)), holdout)
    print("\n| ranking | fp32 nodes | held-out gate | top-1 agree (confident) | top-5 agree | logit error |")
    print("|---|---|---|---|---|---|")
    for name, order in (("damage", [r["node"] for r in damage]), ("SQNR drop", drops)):
        for count in COUNTS:
            model = fallback.revert_to_fp32(qdq, prepared_model, set(order[:count]))
            gate = judge(INT8.name, INT8.precision, fp32_holdout, fallback.session_run(model, holdout))
            m = gate.metrics
            confident = m.get("top1_agreement_confident")
            print(f"| {name} | {count} | {gate.verdict} | {100 * m['top1_agreement']:.1f} % "
                  f"({'-' if confident is None else f'{100 * confident:.1f} %'}) | "
                  f"{100 * m['top5_agreement']:.1f} % | {m['relative_logit_error']:.3f} |")

    made = folder / f"fallback{FALLBACK_NODES}.onnx"
    fallback.save(fallback.revert_to_fp32(qdq, prepared_model, {r["node"] for r in damage[:FALLBACK_NODES]}),
                  made)
    for label, path in (("explicit-activation int8 (fallback's graph)", explicit),
                        (f"fallback-made ({FALLBACK_NODES} damage-ranked nodes fp32)", made)):
        made_report = explain_int8(fp32, path, holdout, module=module)
        print(f"\n{label}: {made_report.line()}")
        print("  lowest: " + "; ".join(f"{r.key or r.node} {r.sqnr_db:.1f}" for r in made_report.worst[:3]))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
