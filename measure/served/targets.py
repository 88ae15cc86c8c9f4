"""The photo-size targets of the serving benchmark, as ratios from the rows of one run:

- fp32 served at concurrency 8 on the 12 MP photo >= 0.75 x the fp32 model alone in-process at batch 8;
- int8 served at concurrency 8 on the example >= 0.8 x the int8 model alone in-process at batch 8;
- on both of those rows p99 <= 2 x p50;
- no errors in any row of our own configurations (the naive baseline and the peer are not ours);
- ours (`default`) ahead of the LitServe peer at concurrency 8 on every body and the mix;
- issue 31, on the example at concurrency 8: what the rule serves (`default`) >= 0.97 x that artifact alone
  in-process at batch 8; and, per model, >= 1.8 x today's fp32 default (`fp32-onnx`) for ResNet-50 and >= 1.1 x
  today's served int8 (`int8`) for EfficientNet-Lite0 (what `default` serves passed its gate: the rule serves
  nothing else).

A target whose rows the run did not measure says `not measured` and what to add.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from measure.served.configurations import CONFIGURATIONS, DEFAULT, INT8, LITSERVE, NAIVE
from measure.served.report import TARGET_CONCURRENCY, TARGET_TAIL_RATIO, Target, ratio

TARGET_12MP_FP32 = 0.75  # served / model alone, fp32, on the 12 MP photo
TARGET_EXAMPLE_INT8 = 0.8  # served / model alone, int8, on the example
TWELVE_MP = 12_000_000  # pixels: a phone photo (4032 x 3024 is 12.2 M)
PEER_AHEAD = 1.0  # ours / LitServe's req/s
FP32_ROWS = (DEFAULT, "fp32-onnx")  # where an fp32 artifact is served (default serves int8 when it passed its gate)
INT8_ROWS = (DEFAULT, INT8)
TARGET_SERVED_VS_ALONE = 0.97  # served (default) / the served artifact alone in-process, on the example
# Per model: (the configuration that serves what was the default before the hardware-aware rule, the least ratio)
TARGET_VS_TODAY = {"resnet50": ("fp32-onnx", 1.8), "efficientnet-lite0": (INT8, 1.1)}
NOT_OURS = (NAIVE, LITSERVE)


def phone_photo(files: list[Path]) -> str | None:
    """The largest body of at least 12 MP (read from its header), or None."""
    sizes = {}
    for path in files:
        with Image.open(path) as image:
            sizes[path.name] = image.width * image.height
    large = [name for name, pixels in sizes.items() if pixels >= TWELVE_MP]
    return max(large, key=sizes.get) if large else None


def at_target(rows: list[dict], names: tuple[str, ...], body: str | None, precision: str) -> dict | None:
    """The first row of configurations `names` (in that order) serving `precision` on `body` at c=8."""
    found = [r for name in names for r in rows if r["configuration"] == name and r.get("body") == body
             and r["concurrency"] == TARGET_CONCURRENCY and r.get("precision") == precision]
    return found[0] if found else None


def versus_model(row: dict | None, best: dict[str, dict[int, float]], precision: str, body: str | None,
                 threshold: float, missing: str) -> list[Target]:
    """served / the model alone at batch 8 of the row's precision, and the row's p99 / p50."""
    label = f"{precision} served at c={TARGET_CONCURRENCY} on {body or 'the body'}"
    model = best.get(precision, {}).get(TARGET_CONCURRENCY)
    if row is None or model is None:
        missing = missing if row is None else f"the in-process benchmark's {precision} batch {TARGET_CONCURRENCY}"
        return [Target(f"{label} / {precision} model alone at batch {TARGET_CONCURRENCY}", None, threshold, None,
                       f"not measured: needs {missing}"),
                Target(f"{label}: p99 / p50", None, TARGET_TAIL_RATIO, None, "not measured", at_most=True)]
    label = f"{precision} served ({row['configuration']}) at c={TARGET_CONCURRENCY} on {body}"
    value = ratio(row["req_per_s"], model)
    return [Target(f"{label} / {precision} model alone at batch {TARGET_CONCURRENCY}", value, threshold,
                   value >= threshold, f"{row['req_per_s']:.1f} req/s vs {model:.1f} img/s"),
            tail_target(row, f"{label}: p99 / p50")]


def tail_target(row: dict, name: str) -> Target:
    """p99 / p50 <= 2. With fewer than 100 answers hey prints no p99: the slowest request, an upper bound of
    it, then proves the target met when it is within 2 x p50, and leaves it unmeasured otherwise."""
    p50, p99, slowest = row.get("p50_ms"), row.get("p99_ms"), row.get("slowest_ms")
    if p50 and p99:
        tail = p99 / p50
        return Target(name, tail, TARGET_TAIL_RATIO, tail <= TARGET_TAIL_RATIO, f"p50 {p50:.0f} ms, p99 {p99:.0f} ms",
                      at_most=True)
    if p50 and slowest and slowest / p50 <= TARGET_TAIL_RATIO:
        return Target(name, slowest / p50, TARGET_TAIL_RATIO, True,
                      f"p50 {p50:.0f} ms, slowest {slowest:.0f} ms (under 100 answers: no p99; the slowest bounds it)",
                      at_most=True)
    return Target(name, None, TARGET_TAIL_RATIO, None, f"not measured: {row['requests']} answers, hey prints a p99 "
                  "from 100; a longer --duration gives one", at_most=True)


def no_errors(rows: list[dict]) -> Target:
    ours = [r for r in rows if r["configuration"] not in NOT_OURS]
    failed = sum(r["failed"] for r in ours)
    return Target("errors in our configurations' rows", failed if ours else None, 0,
                  failed == 0 if ours else None, f"{failed} of {sum(r['requests'] for r in ours)} requests",
                  at_most=True)


def ahead_of_peer(rows: list[dict]) -> list[Target]:
    """default / litserve at c=8 per body (and the mix) that both measured."""
    def at_c8(name):
        return {r["body"]: r for r in rows if r["configuration"] == name and r["concurrency"] == TARGET_CONCURRENCY}

    ours, peer = at_c8(DEFAULT), at_c8(LITSERVE)
    targets = [Target(f"ours (default) / LitServe peer at c={TARGET_CONCURRENCY} on {body}",
                      ratio(ours[body]["req_per_s"], peer[body]["req_per_s"]), PEER_AHEAD,
                      ours[body]["req_per_s"] > peer[body]["req_per_s"],
                      f"{ours[body]['req_per_s']:.1f} vs {peer[body]['req_per_s']:.1f} req/s")
               for body in ours if body in peer]
    return targets or [Target(f"ours (default) / LitServe peer at c={TARGET_CONCURRENCY}", None, PEER_AHEAD, None,
                              "not measured: --configurations default,litserve with concurrency 8")]


def at_c8(rows: list[dict], name: str, body: str) -> dict | None:
    return next((r for r in rows if r["configuration"] == name and r.get("body") == body
                 and r["concurrency"] == TARGET_CONCURRENCY), None)


def hardware_aware(rows: list[dict], example: str) -> list[Target]:
    """Issue 31's targets on the example: the default row against its own artifact alone, and against the row that
    serves what the default was before (per model, TARGET_VS_TODAY)."""
    served = at_c8(rows, DEFAULT, example)
    label = f"default served at c={TARGET_CONCURRENCY} on {example}"
    if served is None:
        return [Target(f"{label} / its artifact alone", None, TARGET_SERVED_VS_ALONE, None,
                       "not measured: --configurations default with concurrency 8")]
    alone = served.get("vs_inprocess")
    found = [Target(f"{label} ({served.get('artifact')}) / {served.get('artifact')} alone in-process at batch "
                    f"{served.get('inprocess_batch')}", alone, TARGET_SERVED_VS_ALONE,
                    None if alone is None else alone >= TARGET_SERVED_VS_ALONE,
                    f"{served['req_per_s']:.1f} req/s vs {served['inprocess_per_s']:.1f} img/s" if alone is not None
                    else "not measured: needs the in-process benchmark (--inprocess run)")]
    if served.get("model") in TARGET_VS_TODAY:
        found += versus_today(rows, served, example)
    return found


def versus_today(rows: list[dict], served: dict, example: str) -> list[Target]:
    """The default row, and every speed-only row (a variant whose gate failed, served for its speed only), against
    the row serving what the default was before issue 31; when that is what the default serves, the default row
    itself (the bench skips a configuration that repeats it)."""
    name, threshold = TARGET_VS_TODAY[served["model"]]
    today = at_c8(rows, name, example)
    if today is None and served.get("artifact") == CONFIGURATIONS[name].artifact:
        today = served
    speed_only = [r for r in rows if r.get("gate") and r.get("body") == example
                  and r["concurrency"] == TARGET_CONCURRENCY]
    found = []
    today_kind = today.get("artifact") if today else "not run"
    for row in [served] + speed_only:
        value = ratio(row["req_per_s"], today["req_per_s"]) if today else None
        label = (f"{row['configuration']} ({row.get('artifact')}{', speed only' if row.get('gate') else ''}) at "
                 f"c={TARGET_CONCURRENCY} on {example} / today's {name} ({today_kind})")
        met = None if value is None or row.get("gate") else value >= threshold  # speed only: never counts as met
        detail = (f"{row['req_per_s']:.1f} vs {today['req_per_s']:.1f} req/s" if today
                  else f"not measured: add {name} to --configurations")
        found.append(Target(label, value, threshold, met, detail + (f" ({row['gate']}: not servable)" if row.get("gate")
                                                                    else "")))
    return found


def evaluate(rows: list[dict], best: dict[str, dict[int, float]], files: list[Path], example: str) -> list[Target]:
    photo = phone_photo(files)
    fp32 = at_target(rows, FP32_ROWS, photo, "fp32")
    int8 = at_target(rows, INT8_ROWS, example, "int8")
    return (versus_model(fp32, best, "fp32", photo, TARGET_12MP_FP32,
                         f"an fp32 row ({' or '.join(FP32_ROWS)}) at concurrency {TARGET_CONCURRENCY}"
                         if photo else "a 12 MP photo in --images (python -m examples.photo_sizes DIR writes one)")
            + versus_model(int8, best, "int8", example, TARGET_EXAMPLE_INT8,
                           f"an int8 row ({' or '.join(INT8_ROWS)}: export --precision fp32,int8) on {example} at "
                           f"concurrency {TARGET_CONCURRENCY}")
            + [no_errors(rows)] + ahead_of_peer(rows) + hardware_aware(rows, example))
