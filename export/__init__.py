"""How to export a model and prove each artifact is the same model (kept import-light: the TorchServe
archive ships this package for export.runtime's ONNX Runtime session factory)."""
