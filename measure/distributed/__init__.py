"""Measurements across Ray nodes: a two-node Ray Serve cluster on this machine, a node killed under load
(two_node.py, `python -m measure ray-two-node`)."""
