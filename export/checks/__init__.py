"""What proves an artifact is the model: the eval-mode check, the ONNX checks, parity against eager, trace vs
script on probe inputs, a second ONNX opinion for small models, and the decode check of the request path."""
