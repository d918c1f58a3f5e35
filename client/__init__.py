"""The txnbuf async client SDK.

::

    from client import Client

    async with Client("http://127.0.0.1:6650") as client:
        producer = await client.create_producer("orders")
        msg_id = await producer.send(b"payload", key="customer-7")
        consumer = await client.subscribe("orders", "billing", initial_position="earliest")
        msg = await consumer.receive()
        await consumer.acknowledge(msg)

        async with client.transaction(timeout=60.0) as txn:  # PIP-31
            await producer.send(b"derived", txn=txn)
            await consumer.acknowledge(await consumer.receive(), txn=txn)

Everything the client raises derives from ``client.errors.TxnbufError``.
The client imports only ``proto``, the standard library and aiohttp.
"""

from proto import TxnID

from . import errors
from ._client import Client
from ._consumer import Consumer
from ._deadletter import DeadLetterPolicy
from ._epoch import PreparedTxnState, ProducerState, TransactionalProducer
from ._groups import GroupResult, TransactionGroups
from ._message import Message, MessageId
from ._producer import Producer
from ._reader import Position, Reader, ReadResult, SubscriptionCursor
from ._txn import Transaction, TxnState

__all__ = [
    "Client",
    "Consumer",
    "DeadLetterPolicy",
    "GroupResult",
    "Message",
    "MessageId",
    "Position",
    "PreparedTxnState",
    "Producer",
    "ProducerState",
    "ReadResult",
    "Reader",
    "SubscriptionCursor",
    "Transaction",
    "TransactionGroups",
    "TransactionalProducer",
    "TxnID",
    "TxnState",
    "errors",
]
