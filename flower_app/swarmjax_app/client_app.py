"""``client``: the ClientApp that ``flwr run`` loads on every SuperNode, once per message.

It imports no JAX and no algorithm code: it relays each message to the node's long-lived
worker (``swarmjax.fl.runtime.flower.relay``), so a message costs Flower's own process
start-up, not swarmjax's. Under Flower's simulation runtime it answers in its own process.
"""

from swarmjax.fl.runtime.flower.relay import make_relay_app

client = make_relay_app()
