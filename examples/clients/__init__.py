"""Clients for each deployment: TorchServe, KServe v1, and the Open Inference Protocol v2 (Triton, KServe).

Run them from the repository root as modules (`python -m examples.clients.torchserve_client ...`).
"""

# The archive `python -m export resnet` writes by default (resnet50.mar, /predictions/resnet50): models.resnet's
# DEFAULT_ARCH, written out so that the TorchServe and KServe clients import nothing heavier than requests
# (tests/handlers/test_clients.py holds the two equal).
DEFAULT_MODEL = "resnet50"
