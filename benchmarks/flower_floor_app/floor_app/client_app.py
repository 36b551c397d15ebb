"""``client``: echo the array of every message (numpy only)."""

from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

client = ClientApp()


@client.query("hello")
@client.train("exchange")
def echo(msg: Message, context: Context) -> Message:
    del context
    arrays = msg.content["request"]
    return Message(RecordDict({"reply": ArrayRecord(dict(arrays.items()))}), reply_to=msg)
