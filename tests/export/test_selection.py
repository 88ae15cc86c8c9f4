"""The served-artifact rule: declared, deterministic, never a diverging or failing artifact."""

from export.selection import SERVING_PREFERENCE, Candidate, decide

SIZE = (3, 224, 224)


def candidate(kind, passed=True, diverging=(), dynamic=True, size=SIZE):
    return Candidate(kind, passed, tuple(diverging), dynamic, size)


def all_good():
    return [candidate(kind) for kind in reversed(SERVING_PREFERENCE)]  # order of discovery must not matter


def test_the_first_of_the_preference_order_is_served_and_the_choice_is_repeatable():
    first, second = decide(all_good(), SIZE), decide(list(reversed(all_good())), SIZE)
    assert first["default_artifact"] == second["default_artifact"] == SERVING_PREFERENCE[0]
    assert first == second
    assert first["servable"] == list(SERVING_PREFERENCE)


def test_a_diverging_traced_artifact_is_never_served_even_when_it_is_the_only_one_left():
    candidates = [candidate("traced", diverging=["spatial 24x24"]),
                  candidate("onnx-traced", diverging=["spatial 24x24"]),
                  candidate("scripted", passed=False), candidate("onnx-scripted", passed=False)]
    decision = decide(candidates, SIZE)
    assert decision["default_artifact"] is None and decision["servable"] == []
    assert decision["candidates"]["traced"] == "silently diverges from eager on: spatial 24x24"
    assert decision["candidates"]["scripted"] == "failed parity"


def test_parity_failure_and_input_contract_exclude_with_reasons():
    candidates = [candidate("onnx-dynamo", passed=False), candidate("onnx-scripted", dynamic=False, size=(3, 320, 320)),
                  candidate("onnx-traced", dynamic=False), candidate("scripted")]
    decision = decide(candidates, SIZE)
    assert decision["default_artifact"] == "onnx-traced"
    assert decision["candidates"]["onnx-scripted"] == "takes exactly 3x320x320, the handler sends 3x224x224"
    assert decision["candidates"]["scripted"] == "servable (later in the preference order)"


def test_a_model_without_image_input_has_nothing_to_serve():
    decision = decide(all_good(), None)
    assert decision["default_artifact"] is None
    assert set(decision["candidates"].values()) == {"the model takes no image input the handler can send"}
