"""What proves an artifact is the model: the eval-mode check, each format's structural checks (inspection.py),
parity against eager, trace vs script on probe inputs, a second ONNX opinion for small models, and the decode
check of the request path (with agreement.py, how two sets of logits agree, which the accuracy gate shares)."""
