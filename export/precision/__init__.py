"""Reduced precision: what was asked for (request.py), calibration images (calibration.py), the variants built
(variants.py), the accuracy gate (gate.py) and int8's fp32 fallback of the worst nodes (int8_fallback.py)."""
