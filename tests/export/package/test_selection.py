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
    assert PREFERENCE == ("onnx-int8", "onnx-dynamo", "onnx-scripted", "aotinductor", "onnx-traced", "exported",
                          "scripted", "traced")
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
