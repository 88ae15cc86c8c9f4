"""The served-artifact rule: declared, deterministic, never a diverging or failing artifact."""

import pytest

from export.errors import ExportError
from export.forms import kinds
from export.package.selection import Candidate, decide, redecide

SIZE = (3, 224, 224)
PREFERENCE = kinds.serving_preference()
FP32_PREFERENCE = tuple(k for k in PREFERENCE if not kinds.get(k).is_variant)


def candidate(kind, passed=True, diverging=(), dynamic=True, size=SIZE):
    return Candidate(kind, passed, tuple(diverging), dynamic, size)


def all_good():
    return [candidate(kind) for kind in reversed(FP32_PREFERENCE)]  # order of discovery must not matter


def test_the_preference_order_comes_from_the_kinds_table():
    assert PREFERENCE == ("openvino-int8", "openvino-int8-bf16", "onnx-int8", "executorch-int8", "openvino-bf16",
                          "onnx-dynamo", "executorch", "openvino", "onnx-scripted", "aotinductor", "onnx-traced",
                          "exported", "scripted-bf16-backbone", "scripted", "traced")
    ranks = [kinds.get(k).serving_rank for k in PREFERENCE]
    assert ranks == sorted(ranks) and all(kinds.get(k).rank_reason for k in PREFERENCE)


def test_the_first_of_the_preference_order_is_served_and_the_choice_is_repeatable():
    first, second = decide(all_good(), SIZE), decide(list(reversed(all_good())), SIZE)
    assert first.served == second.served == FP32_PREFERENCE[0] == "onnx-dynamo"
    assert first == second
    assert first.servable == list(FP32_PREFERENCE)
    assert first.requested is None and not first.speed_only


def test_a_diverging_traced_artifact_is_never_served_even_when_it_is_the_only_one_left():
    candidates = [candidate("traced", diverging=["spatial 24x24"]),
                  candidate("onnx-traced", diverging=["spatial 24x24"]),
                  candidate("scripted", passed=False), candidate("onnx-scripted", passed=False)]
    decision = decide(candidates, SIZE)
    assert decision.served is None and decision.servable == []
    assert decision.candidates["traced"] == "silently diverges from eager on: spatial 24x24"
    assert decision.candidates["scripted"] == "failed parity"


def test_parity_failure_and_input_contract_exclude_with_reasons():
    candidates = [candidate("onnx-dynamo", passed=False), candidate("onnx-scripted", dynamic=False, size=(3, 320, 320)),
                  candidate("onnx-traced", dynamic=False), candidate("scripted")]
    decision = decide(candidates, SIZE)
    assert decision.served == "onnx-traced"
    assert decision.candidates["onnx-scripted"] == "takes exactly 3x320x320, the handler sends 3x224x224"
    assert decision.candidates["scripted"] == "servable (later in the preference order)"


def test_a_model_without_image_input_has_nothing_to_serve():
    decision = decide(all_good(), None)
    assert decision.served is None
    assert set(decision.candidates.values()) == {"the model takes no image input the handler can send"}


def test_serve_picks_another_servable_kind_and_refuses_a_diverging_one_with_the_reason():
    candidates = all_good() + [candidate("traced", diverging=["spatial 320x320"])]
    candidates = [c for c in candidates if not (c.kind == "traced" and not c.diverging_on)]
    asked = decide(candidates, SIZE, requested="scripted")
    assert asked.served == "scripted" and asked.requested == "scripted" and not asked.speed_only
    assert asked.candidates["scripted"] == "served"
    assert asked.candidates["onnx-dynamo"] == "servable (not requested)"
    with pytest.raises(ExportError, match="refusing to serve 'traced': silently diverges from eager on: "
                                          "spatial 320x320"):
        decide(candidates, SIZE, requested="traced")
    with pytest.raises(ExportError, match="cannot serve 'onnx-int8': this export has"):
        redecide(decide(candidates, SIZE), "onnx-int8")


# ---------------------------------------------------------------- the hardware-aware part: targets and candidates

from export.precision.gate import GATE_PASSED  # noqa: E402
from runtime.form_choice import declared_choice  # noqa: E402
from runtime.machine import BF16_FLAGS, CPU, PROFILES, Needs  # noqa: E402


@pytest.fixture
def bf16_kind():
    """A ranked bf16 row, fast only with native bf16 (the design's test: a new row needs no other edit)."""
    kinds.register(kinds.ArtifactKind(
        name="test-bf16", file_name="model.test.bf16", format=kinds.ONNX, exporter="test", input_sizes="source",
        serving_rank=-1, rank_reason="test row", precision="bf16", sources=("onnx-dynamo",),
        runs_on=Needs(CPU), fast_on=Needs(CPU, (BF16_FLAGS,))))
    yield "test-bf16"
    kinds.unregister("test-bf16")


def gated_export(*variants):
    return all_good() + [Candidate(k, True, (), True, SIZE, gate=GATE_PASSED) for k in variants]


@pytest.mark.parametrize(("target", "served"), [("amx", "test-bf16"), ("avx512-bf16", "test-bf16"),
                                                ("avx512-vnni", "onnx-int8"), ("avx2", "onnx-int8"),
                                                ("cuda", "onnx-dynamo")])
def test_the_target_serves_the_first_gated_candidate_it_meets(bf16_kind, target, served):
    decision = decide(gated_export("onnx-int8", bf16_kind), SIZE, target=PROFILES[target])
    assert decision.served == served and decision.target == target
    # the candidates the archive ships: preference order, cut after the first that needs nothing
    assert [c["kind"] for c in decision.gated] == [bf16_kind, "onnx-int8", "onnx-dynamo"]
    assert declared_choice(decision.gated, PROFILES[target]).kind == served  # the rule without measuring
    if served != bf16_kind:
        assert decision.candidates[bf16_kind].startswith(f"servable on another machine ({target}: ")


def test_a_failed_gate_is_never_a_candidate_on_any_machine(bf16_kind):
    failed = all_good() + [Candidate(bf16_kind, True, (), True, SIZE, gate="failed: top-1 agreement 50%")]
    decision = decide(failed, SIZE, target=PROFILES["amx"])
    assert decision.served == "onnx-dynamo" and [c["kind"] for c in decision.gated] == ["onnx-dynamo"]


def test_an_artifacts_own_needs_are_kept_beside_its_kinds():
    vnni = Needs(CPU, (("avx512_vnni", "avx_vnni", "amx_int8"),))
    candidates = all_good() + [Candidate("onnx-int8", True, (), True, SIZE, gate=GATE_PASSED, runs_on=vnni)]
    assert decide(candidates, SIZE, target=PROFILES["avx2"]).served == "onnx-dynamo"  # 8-bit weights saturate
    assert decide(candidates, SIZE, target=PROFILES["avx512-vnni"]).served == "onnx-int8"


def test_a_kind_asked_for_is_the_one_candidate_shipped():
    decision = decide(gated_export("onnx-int8"), SIZE, requested="onnx-scripted", target=PROFILES["avx2"])
    assert decision.served == "onnx-scripted" and [c["kind"] for c in decision.gated] == ["onnx-scripted"]
    assert decision.candidate_kinds() == ["onnx-scripted"]
