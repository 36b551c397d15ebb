"""Run swarmjax's federated algorithms as a Flower deployment (needs the ``flower`` extra).

:mod:`swarmjax.flower.records` converts pytrees to Flower records.
"""
