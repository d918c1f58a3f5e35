"""Kafka's wire protocol in front of the broker: unmodified Kafka clients
(aiokafka, kafka-python, confluent-kafka) produce, consume, commit offsets
and run transactions against txnbuf's topics, coordinators and
subscriptions. See docs/kafka.md for what is served and how it maps.

`KafkaListener` serves it on its own port (``txnbuf serve --kafka-port``).
"""

from broker.kafka._listener import KafkaListener
from broker.kafka._offsets import OFFSET_BITS, offset_of, position_of

__all__ = ["OFFSET_BITS", "KafkaListener", "offset_of", "position_of"]
