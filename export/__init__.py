"""How to export a model and prove each artifact is the same model: formats, eval check, ONNX checks,
parity, trace vs script, the serving rule, the manifest and the archive."""
