"""Fixtures of the end-to-end tests that compare a served answer with the archive's artifact run in-process."""

from __future__ import annotations

import pytest

from tests.answers import cached_answers


@pytest.fixture(scope="module")
def expect(resnet18_export):
    """image bytes (, topk) -> the answer resnet18.mar gives in-process by the form a served answer names, computed
    once per image and form."""
    return cached_answers(resnet18_export["archive"])
