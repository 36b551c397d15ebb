"""``server`` and ``client``: the ServerApp and ClientApp that ``flwr run`` loads."""

from swarmjax.fl.runtime.flower.client import make_client_app
from swarmjax.fl.runtime.flower.server import make_server_app

server = make_server_app()
client = make_client_app()
