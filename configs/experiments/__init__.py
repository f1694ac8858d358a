"""Experiment definitions for `sgs-experiments`: configs x seeds (see sgs_jax/experiments.py)."""
