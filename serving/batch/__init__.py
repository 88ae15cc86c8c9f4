"""Offline scoring: `python -m serving batch PATH INPUT --out OUT` (serving/batch/run.py), the served form through
the endpoint's request core over a folder or a table of photos (one machine: a process pool; a cluster: Ray Data),
into resumable Parquet parts."""
