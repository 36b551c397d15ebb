"""``server``: the ServerApp that ``flwr run`` loads (it greets the nodes, then imports
JAX and swarmjax while they answer)."""

from swarmjax.fl.runtime.flower.server_app import make_server_app

server = make_server_app()
