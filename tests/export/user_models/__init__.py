"""User-style model files for the export tests, loaded by path as `python -m export module FILE:factory` does."""

from pathlib import Path

USER_FILE = Path(__file__).resolve().parent / "models_for_tests.py"
