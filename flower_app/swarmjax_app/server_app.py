"""``server``: the ServerApp that ``flwr run`` loads (it imports JAX and swarmjax)."""

from swarmjax.fl.runtime.flower.server import make_server_app

server = make_server_app()
