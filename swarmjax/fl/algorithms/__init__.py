"""Federated algorithms written once on :mod:`swarmjax.fl.protocol` (one file each)."""
