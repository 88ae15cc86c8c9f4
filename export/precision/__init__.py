"""Reduced precision: what was asked for (request.py), calibration images (calibration.py), the variants built
(variants.py), each by its kind's builder (builder.py: what every builder is given; onnx_int8.py, openvino_int8.py,
half.py), the held-out images and the accuracy gate (held_out.py, gate.py) and int8's fp32 fallback of the worst
nodes (int8_fallback.py)."""
