"""What ships: the serving rule (selection.py), manifest.json (manifest.py), the TorchServe archive (archive.py),
and the model rebuilt from a manifest (rebuild.py)."""
