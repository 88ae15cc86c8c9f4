"""Measurements in one process: every artifact of an export against this machine's GEMM peak (bench.py, peak.py,
records.py, report.py) and AOTInductor's CPU options (aoti_tuning.py)."""
