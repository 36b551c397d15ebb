"""swarmjax: a JAX-accelerated, vectorised swarm engine for privacy-preserving federated learning.

Subpackages are imported on demand: ``swarmjax.swarm``, ``swarmjax.objectives``,
``swarmjax.paaso``, ``swarmjax.sweep``, ``swarmjax.privacy``, ``swarmjax.fl``,
``swarmjax.models``.
"""

__version__ = "0.1.0"
