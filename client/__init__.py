"""The txnbuf async client SDK.

::

    from client import Client

    async with Client("http://127.0.0.1:6650") as client:
        producer = await client.create_producer("orders")
        msg_id = await producer.send(b"payload", key="customer-7")
        consumer = await client.subscribe("orders", "billing", initial_position="earliest")
        msg = await consumer.receive()
        await consumer.acknowledge(msg)

Everything the client raises derives from ``client.errors.TxnbufError``.
The client imports only ``proto``, the standard library and aiohttp.
"""

from . import errors
from ._client import Client
from ._consumer import Consumer
from ._message import Message, MessageId
from ._producer import Producer

__all__ = ["Client", "Consumer", "Message", "MessageId", "Producer", "errors"]
