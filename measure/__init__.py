"""How a served model is measured: the benchmark, the soak, the worker-kill fault, the GPU check, and the one
load generator runner they share (loadgen.py). Kept import-free: the GPU check runs with plain python3."""
