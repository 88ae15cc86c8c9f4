"""The forms an export can write: the table of artifact kinds (kinds.py, with the parity tolerance each names:
tolerances.py) and the exporter functions that make each one (exporters.py: TorchScript and ONNX; torch_export.py:
torch.export's own artifacts; openvino_ir.py)."""
