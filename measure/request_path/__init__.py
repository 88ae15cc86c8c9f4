"""The request path in one process: decode -> preprocess -> inference -> encode per body size (pipeline.py), and
the JPEG decoders compared (decoders.py)."""
