"""swarmjax: a JAX-accelerated, vectorised swarm engine for privacy-preserving federated learning.

Subpackages are imported on demand: ``swarmjax.swarm``, ``swarmjax.objectives``,
``swarmjax.paaso``, ``swarmjax.sweep``, ``swarmjax.privacy``, ``swarmjax.fl``,
``swarmjax.models``.
"""

__version__ = "0.1.0"

from swarmjax import _moved

_moved.install()  # old module paths of swarmjax.fl and swarmjax.flower, for one release
