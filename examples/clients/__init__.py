"""Clients for each deployment: TorchServe, KServe v1, and the Open Inference Protocol v2 (Triton, KServe)."""
