"""A variant whose source is built only when named (executorch-int8 from executorch) is left out without a word
under the default precision, and with its reason when precisions were asked for (export/precision/variants.py)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_an_int8_asked_for_says_why_its_opt_in_form_was_not_made(lite0_int8_export):
    assert "executorch-int8 not made: its source executorch is built when named in --formats" in lite0_int8_export["stdout"]
    assert "executorch-int8" not in lite0_int8_export["manifest"].artifacts
