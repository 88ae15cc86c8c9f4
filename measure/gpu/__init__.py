"""The GPU check: one command that proves the GPU path on any CUDA machine. Import-free: it runs from a plain
checkout with python3."""
