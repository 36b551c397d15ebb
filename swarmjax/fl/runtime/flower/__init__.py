"""Run swarmjax's federated algorithms as a Flower deployment (needs the ``flower`` extra).

:mod:`swarmjax.fl.runtime.flower.records` converts pytrees to Flower records.
"""
