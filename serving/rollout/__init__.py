"""Versions of a served model: rollout (load beside, agreement gate, switch, drain), rollback, over one small
interface per engine (switchboard.py). docs/rollout.md."""
