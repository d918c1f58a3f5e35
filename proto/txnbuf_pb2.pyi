from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServerError(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN_ERROR: _ClassVar[ServerError]
    MALFORMED_FRAME: _ClassVar[ServerError]
    UNKNOWN_COMMAND: _ClassVar[ServerError]
    INVALID_TOPIC_NAME: _ClassVar[ServerError]
    INVALID_ARGUMENT: _ClassVar[ServerError]
    PERSISTENCE_ERROR: _ClassVar[ServerError]
    SERVICE_NOT_READY: _ClassVar[ServerError]
    PRODUCER_NOT_FOUND: _ClassVar[ServerError]
    CONSUMER_NOT_FOUND: _ClassVar[ServerError]
    PRODUCER_BUSY: _ClassVar[ServerError]
    CONSUMER_BUSY: _ClassVar[ServerError]
    SUBSCRIPTION_TYPE_MISMATCH: _ClassVar[ServerError]
    UNKNOWN_MESSAGE_ID: _ClassVar[ServerError]
    NOT_ALLOWED: _ClassVar[ServerError]
    SEQUENCE_TOO_OLD: _ClassVar[ServerError]
    TOPIC_NOT_FOUND: _ClassVar[ServerError]
    TOO_MANY_REQUESTS: _ClassVar[ServerError]
    AUTHENTICATION_ERROR: _ClassVar[ServerError]
    AUTHORIZATION_ERROR: _ClassVar[ServerError]
    NOT_OWNER: _ClassVar[ServerError]
    TRANSACTION_CONFLICT: _ClassVar[ServerError]
    TRANSACTION_NOT_FOUND: _ClassVar[ServerError]
    INVALID_TXN_STATUS: _ClassVar[ServerError]
    TRANSACTION_TIMEOUT: _ClassVar[ServerError]
    PRODUCER_FENCED: _ClassVar[ServerError]
    TRANSACTION_COORDINATOR_NOT_FOUND: _ClassVar[ServerError]
    INVALID_TXN_STATE: _ClassVar[ServerError]
    OUT_OF_ORDER_SEQUENCE: _ClassVar[ServerError]
    TRANSACTION_ABORTABLE: _ClassVar[ServerError]
    INVALID_PRODUCER_ID_MAPPING: _ClassVar[ServerError]
    INVALID_PRODUCER_EPOCH: _ClassVar[ServerError]
    CONCURRENT_TRANSACTIONS: _ClassVar[ServerError]
    INVALID_TRANSACTION_TIMEOUT: _ClassVar[ServerError]

class TxnAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMIT: _ClassVar[TxnAction]
    ABORT: _ClassVar[TxnAction]

class TxnStatusValue(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPEN: _ClassVar[TxnStatusValue]
    COMMITTING: _ClassVar[TxnStatusValue]
    COMMITTED: _ClassVar[TxnStatusValue]
    ABORTING: _ClassVar[TxnStatusValue]
    ABORTED: _ClassVar[TxnStatusValue]
    PREPARED: _ClassVar[TxnStatusValue]
UNKNOWN_ERROR: ServerError
MALFORMED_FRAME: ServerError
UNKNOWN_COMMAND: ServerError
INVALID_TOPIC_NAME: ServerError
INVALID_ARGUMENT: ServerError
PERSISTENCE_ERROR: ServerError
SERVICE_NOT_READY: ServerError
PRODUCER_NOT_FOUND: ServerError
CONSUMER_NOT_FOUND: ServerError
PRODUCER_BUSY: ServerError
CONSUMER_BUSY: ServerError
SUBSCRIPTION_TYPE_MISMATCH: ServerError
UNKNOWN_MESSAGE_ID: ServerError
NOT_ALLOWED: ServerError
SEQUENCE_TOO_OLD: ServerError
TOPIC_NOT_FOUND: ServerError
TOO_MANY_REQUESTS: ServerError
AUTHENTICATION_ERROR: ServerError
AUTHORIZATION_ERROR: ServerError
NOT_OWNER: ServerError
TRANSACTION_CONFLICT: ServerError
TRANSACTION_NOT_FOUND: ServerError
INVALID_TXN_STATUS: ServerError
TRANSACTION_TIMEOUT: ServerError
PRODUCER_FENCED: ServerError
TRANSACTION_COORDINATOR_NOT_FOUND: ServerError
INVALID_TXN_STATE: ServerError
OUT_OF_ORDER_SEQUENCE: ServerError
TRANSACTION_ABORTABLE: ServerError
INVALID_PRODUCER_ID_MAPPING: ServerError
INVALID_PRODUCER_EPOCH: ServerError
CONCURRENT_TRANSACTIONS: ServerError
INVALID_TRANSACTION_TIMEOUT: ServerError
COMMIT: TxnAction
ABORT: TxnAction
OPEN: TxnStatusValue
COMMITTING: TxnStatusValue
COMMITTED: TxnStatusValue
ABORTING: TxnStatusValue
ABORTED: TxnStatusValue
PREPARED: TxnStatusValue

class MessageIdData(_message.Message):
    __slots__ = ("partition", "entry_id", "batch_index")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    partition: int
    entry_id: int
    batch_index: int
    def __init__(self, partition: _Optional[int] = ..., entry_id: _Optional[int] = ..., batch_index: _Optional[int] = ...) -> None: ...

class SingleMessage(_message.Message):
    __slots__ = ("payload", "key", "properties", "sequence_id", "publish_time_ms")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    key: str
    properties: _containers.ScalarMap[str, str]
    sequence_id: int
    publish_time_ms: int
    def __init__(self, payload: _Optional[bytes] = ..., key: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., sequence_id: _Optional[int] = ..., publish_time_ms: _Optional[int] = ...) -> None: ...

class EntryBatch(_message.Message):
    __slots__ = ("messages", "producer_name", "txnid_most_bits", "txnid_least_bits")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[SingleMessage]
    producer_name: str
    txnid_most_bits: int
    txnid_least_bits: int
    def __init__(self, messages: _Optional[_Iterable[_Union[SingleMessage, _Mapping]]] = ..., producer_name: _Optional[str] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ...) -> None: ...

class CommandConnect(_message.Message):
    __slots__ = ("client_version", "protocol_version", "auth_method", "auth_data")
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    AUTH_METHOD_FIELD_NUMBER: _ClassVar[int]
    AUTH_DATA_FIELD_NUMBER: _ClassVar[int]
    client_version: str
    protocol_version: int
    auth_method: str
    auth_data: bytes
    def __init__(self, client_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., auth_method: _Optional[str] = ..., auth_data: _Optional[bytes] = ...) -> None: ...

class CommandConnected(_message.Message):
    __slots__ = ("server_version", "protocol_version", "max_message_size", "tc_ids", "slots")
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TC_IDS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    protocol_version: int
    max_message_size: int
    tc_ids: _containers.RepeatedScalarFieldContainer[int]
    slots: int
    def __init__(self, server_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., max_message_size: _Optional[int] = ..., tc_ids: _Optional[_Iterable[int]] = ..., slots: _Optional[int] = ...) -> None: ...

class CommandPartitionedMetadata(_message.Message):
    __slots__ = ("request_id", "topic")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    topic: str
    def __init__(self, request_id: _Optional[int] = ..., topic: _Optional[str] = ...) -> None: ...

class CommandPartitionedMetadataResponse(_message.Message):
    __slots__ = ("request_id", "partitions", "error", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    partitions: int
    error: ServerError
    message: str
    def __init__(self, request_id: _Optional[int] = ..., partitions: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ...) -> None: ...

class CommandLookupTopic(_message.Message):
    __slots__ = ("request_id", "topic", "tc_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TC_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    topic: str
    tc_id: int
    def __init__(self, request_id: _Optional[int] = ..., topic: _Optional[str] = ..., tc_id: _Optional[int] = ...) -> None: ...

class CommandLookupTopicResponse(_message.Message):
    __slots__ = ("request_id", "broker_service_url", "authoritative", "error", "message", "response")
    class LookupType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CONNECT: _ClassVar[CommandLookupTopicResponse.LookupType]
        REDIRECT: _ClassVar[CommandLookupTopicResponse.LookupType]
    CONNECT: CommandLookupTopicResponse.LookupType
    REDIRECT: CommandLookupTopicResponse.LookupType
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_SERVICE_URL_FIELD_NUMBER: _ClassVar[int]
    AUTHORITATIVE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    broker_service_url: str
    authoritative: bool
    error: ServerError
    message: str
    response: CommandLookupTopicResponse.LookupType
    def __init__(self, request_id: _Optional[int] = ..., broker_service_url: _Optional[str] = ..., authoritative: _Optional[bool] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ..., response: _Optional[_Union[CommandLookupTopicResponse.LookupType, str]] = ...) -> None: ...

class CommandProducer(_message.Message):
    __slots__ = ("request_id", "producer_id", "topic", "producer_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    producer_id: int
    topic: str
    producer_name: str
    def __init__(self, request_id: _Optional[int] = ..., producer_id: _Optional[int] = ..., topic: _Optional[str] = ..., producer_name: _Optional[str] = ...) -> None: ...

class CommandProducerSuccess(_message.Message):
    __slots__ = ("request_id", "producer_name", "last_sequence_id", "partitions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    producer_name: str
    last_sequence_id: int
    partitions: int
    def __init__(self, request_id: _Optional[int] = ..., producer_name: _Optional[str] = ..., last_sequence_id: _Optional[int] = ..., partitions: _Optional[int] = ...) -> None: ...

class CommandCloseProducer(_message.Message):
    __slots__ = ("request_id", "producer_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    producer_id: int
    def __init__(self, request_id: _Optional[int] = ..., producer_id: _Optional[int] = ...) -> None: ...

class CommandSend(_message.Message):
    __slots__ = ("producer_id", "request_id", "partition", "txnid_most_bits", "txnid_least_bits", "transactional", "batch", "first_sequence_id")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    request_id: int
    partition: int
    txnid_most_bits: int
    txnid_least_bits: int
    transactional: bool
    batch: bytes
    first_sequence_id: int
    def __init__(self, producer_id: _Optional[int] = ..., request_id: _Optional[int] = ..., partition: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., transactional: _Optional[bool] = ..., batch: _Optional[bytes] = ..., first_sequence_id: _Optional[int] = ...) -> None: ...

class CommandSendReceipt(_message.Message):
    __slots__ = ("producer_id", "request_id", "partition", "entry_id", "message_ids", "first_batch_index")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    request_id: int
    partition: int
    entry_id: int
    message_ids: _containers.RepeatedCompositeFieldContainer[MessageIdData]
    first_batch_index: int
    def __init__(self, producer_id: _Optional[int] = ..., request_id: _Optional[int] = ..., partition: _Optional[int] = ..., entry_id: _Optional[int] = ..., message_ids: _Optional[_Iterable[_Union[MessageIdData, _Mapping]]] = ..., first_batch_index: _Optional[int] = ...) -> None: ...

class CommandSendError(_message.Message):
    __slots__ = ("producer_id", "request_id", "error", "message")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    request_id: int
    error: ServerError
    message: str
    def __init__(self, producer_id: _Optional[int] = ..., request_id: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ...) -> None: ...

class CommandSubscribe(_message.Message):
    __slots__ = ("request_id", "consumer_id", "topic", "subscription", "sub_type", "initial_position", "consumer_name", "read_uncommitted")
    class SubType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        EXCLUSIVE: _ClassVar[CommandSubscribe.SubType]
        SHARED: _ClassVar[CommandSubscribe.SubType]
        FAILOVER: _ClassVar[CommandSubscribe.SubType]
    EXCLUSIVE: CommandSubscribe.SubType
    SHARED: CommandSubscribe.SubType
    FAILOVER: CommandSubscribe.SubType
    class InitialPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        LATEST: _ClassVar[CommandSubscribe.InitialPosition]
        EARLIEST: _ClassVar[CommandSubscribe.InitialPosition]
    LATEST: CommandSubscribe.InitialPosition
    EARLIEST: CommandSubscribe.InitialPosition
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SUB_TYPE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_UNCOMMITTED_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    consumer_id: int
    topic: str
    subscription: str
    sub_type: CommandSubscribe.SubType
    initial_position: CommandSubscribe.InitialPosition
    consumer_name: str
    read_uncommitted: bool
    def __init__(self, request_id: _Optional[int] = ..., consumer_id: _Optional[int] = ..., topic: _Optional[str] = ..., subscription: _Optional[str] = ..., sub_type: _Optional[_Union[CommandSubscribe.SubType, str]] = ..., initial_position: _Optional[_Union[CommandSubscribe.InitialPosition, str]] = ..., consumer_name: _Optional[str] = ..., read_uncommitted: _Optional[bool] = ...) -> None: ...

class CommandFlow(_message.Message):
    __slots__ = ("consumer_id", "permits")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    permits: int
    def __init__(self, consumer_id: _Optional[int] = ..., permits: _Optional[int] = ...) -> None: ...

class DeliveredEntry(_message.Message):
    __slots__ = ("partition", "entry_id", "data", "indexes", "redelivery_count", "first_index")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    partition: int
    entry_id: int
    data: bytes
    indexes: _containers.RepeatedScalarFieldContainer[int]
    redelivery_count: int
    first_index: int
    def __init__(self, partition: _Optional[int] = ..., entry_id: _Optional[int] = ..., data: _Optional[bytes] = ..., indexes: _Optional[_Iterable[int]] = ..., redelivery_count: _Optional[int] = ..., first_index: _Optional[int] = ...) -> None: ...

class CommandMessage(_message.Message):
    __slots__ = ("consumer_id", "entries")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    entries: _containers.RepeatedCompositeFieldContainer[DeliveredEntry]
    def __init__(self, consumer_id: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[DeliveredEntry, _Mapping]]] = ...) -> None: ...

class CommandAck(_message.Message):
    __slots__ = ("consumer_id", "request_id", "ack_type", "txnid_most_bits", "txnid_least_bits", "transactional", "ranges")
    class AckType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        INDIVIDUAL: _ClassVar[CommandAck.AckType]
        CUMULATIVE: _ClassVar[CommandAck.AckType]
    INDIVIDUAL: CommandAck.AckType
    CUMULATIVE: CommandAck.AckType
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACK_TYPE_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    request_id: int
    ack_type: CommandAck.AckType
    txnid_most_bits: int
    txnid_least_bits: int
    transactional: bool
    ranges: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, consumer_id: _Optional[int] = ..., request_id: _Optional[int] = ..., ack_type: _Optional[_Union[CommandAck.AckType, str]] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., transactional: _Optional[bool] = ..., ranges: _Optional[_Iterable[int]] = ...) -> None: ...

class CommandAckResponse(_message.Message):
    __slots__ = ("consumer_id", "request_id", "error", "message")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    request_id: int
    error: ServerError
    message: str
    def __init__(self, consumer_id: _Optional[int] = ..., request_id: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ...) -> None: ...

class CommandRedeliverUnacknowledged(_message.Message):
    __slots__ = ("consumer_id", "message_ids")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    message_ids: _containers.RepeatedCompositeFieldContainer[MessageIdData]
    def __init__(self, consumer_id: _Optional[int] = ..., message_ids: _Optional[_Iterable[_Union[MessageIdData, _Mapping]]] = ...) -> None: ...

class CommandCloseConsumer(_message.Message):
    __slots__ = ("request_id", "consumer_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    consumer_id: int
    def __init__(self, request_id: _Optional[int] = ..., consumer_id: _Optional[int] = ...) -> None: ...

class CommandSeek(_message.Message):
    __slots__ = ("request_id", "consumer_id", "message_id", "publish_time_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    consumer_id: int
    message_id: MessageIdData
    publish_time_ms: int
    def __init__(self, request_id: _Optional[int] = ..., consumer_id: _Optional[int] = ..., message_id: _Optional[_Union[MessageIdData, _Mapping]] = ..., publish_time_ms: _Optional[int] = ...) -> None: ...

class CommandUnsubscribe(_message.Message):
    __slots__ = ("request_id", "consumer_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    consumer_id: int
    def __init__(self, request_id: _Optional[int] = ..., consumer_id: _Optional[int] = ...) -> None: ...

class CommandActiveConsumerChange(_message.Message):
    __slots__ = ("consumer_id", "is_active")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    IS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    is_active: bool
    def __init__(self, consumer_id: _Optional[int] = ..., is_active: _Optional[bool] = ...) -> None: ...

class CommandSuccess(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class CommandError(_message.Message):
    __slots__ = ("request_id", "error", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: ServerError
    message: str
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ...) -> None: ...

class CommandPing(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CommandPong(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PartitionRef(_message.Message):
    __slots__ = ("topic", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class SubscriptionRef(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class CommandNewTxn(_message.Message):
    __slots__ = ("request_id", "txn_ttl_ms", "tc_id", "tag", "prepared_ttl_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    TC_ID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PREPARED_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txn_ttl_ms: int
    tc_id: int
    tag: str
    prepared_ttl_ms: int
    def __init__(self, request_id: _Optional[int] = ..., txn_ttl_ms: _Optional[int] = ..., tc_id: _Optional[int] = ..., tag: _Optional[str] = ..., prepared_ttl_ms: _Optional[int] = ...) -> None: ...

class CommandNewTxnResponse(_message.Message):
    __slots__ = ("request_id", "txnid_most_bits", "txnid_least_bits", "error", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txnid_most_bits: int
    txnid_least_bits: int
    error: ServerError
    message: str
    def __init__(self, request_id: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ...) -> None: ...

class CommandAddPartitionToTxn(_message.Message):
    __slots__ = ("request_id", "txnid_most_bits", "txnid_least_bits", "partitions", "from_participant", "producer_id", "producer_epoch", "verify_only")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    FROM_PARTICIPANT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    VERIFY_ONLY_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txnid_most_bits: int
    txnid_least_bits: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionRef]
    from_participant: bool
    producer_id: int
    producer_epoch: int
    verify_only: bool
    def __init__(self, request_id: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionRef, _Mapping]]] = ..., from_participant: _Optional[bool] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., verify_only: _Optional[bool] = ...) -> None: ...

class CommandAddSubscriptionToTxn(_message.Message):
    __slots__ = ("request_id", "txnid_most_bits", "txnid_least_bits", "subscriptions", "from_participant", "producer_id", "producer_epoch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    FROM_PARTICIPANT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txnid_most_bits: int
    txnid_least_bits: int
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionRef]
    from_participant: bool
    producer_id: int
    producer_epoch: int
    def __init__(self, request_id: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., subscriptions: _Optional[_Iterable[_Union[SubscriptionRef, _Mapping]]] = ..., from_participant: _Optional[bool] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class CommandEndTxn(_message.Message):
    __slots__ = ("request_id", "txnid_most_bits", "txnid_least_bits", "txn_action", "next_txn_ttl_ms", "next_tc_id", "after_ops")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXN_ACTION_FIELD_NUMBER: _ClassVar[int]
    NEXT_TXN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TC_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_OPS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txnid_most_bits: int
    txnid_least_bits: int
    txn_action: TxnAction
    next_txn_ttl_ms: int
    next_tc_id: int
    after_ops: bool
    def __init__(self, request_id: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., txn_action: _Optional[_Union[TxnAction, str]] = ..., next_txn_ttl_ms: _Optional[int] = ..., next_tc_id: _Optional[int] = ..., after_ops: _Optional[bool] = ...) -> None: ...

class TxnSendData(_message.Message):
    __slots__ = ("producer_id", "partition", "batch", "first_sequence_id")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    partition: int
    batch: bytes
    first_sequence_id: int
    def __init__(self, producer_id: _Optional[int] = ..., partition: _Optional[int] = ..., batch: _Optional[bytes] = ..., first_sequence_id: _Optional[int] = ...) -> None: ...

class TxnAckRanges(_message.Message):
    __slots__ = ("consumer_id", "ranges")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    ranges: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, consumer_id: _Optional[int] = ..., ranges: _Optional[_Iterable[int]] = ...) -> None: ...

class CommandCommitTxn(_message.Message):
    __slots__ = ("request_id", "txnid_most_bits", "txnid_least_bits", "sends", "acks", "next_txn_ttl_ms", "next_tc_id", "commit_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    SENDS_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TXN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TC_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txnid_most_bits: int
    txnid_least_bits: int
    sends: _containers.RepeatedCompositeFieldContainer[TxnSendData]
    acks: _containers.RepeatedCompositeFieldContainer[TxnAckRanges]
    next_txn_ttl_ms: int
    next_tc_id: int
    commit_id: int
    def __init__(self, request_id: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., sends: _Optional[_Iterable[_Union[TxnSendData, _Mapping]]] = ..., acks: _Optional[_Iterable[_Union[TxnAckRanges, _Mapping]]] = ..., next_txn_ttl_ms: _Optional[int] = ..., next_tc_id: _Optional[int] = ..., commit_id: _Optional[int] = ...) -> None: ...

class CommandTxnResponse(_message.Message):
    __slots__ = ("request_id", "txnid_most_bits", "txnid_least_bits", "error", "message", "next_txnid_most_bits", "next_txnid_least_bits")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NEXT_TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txnid_most_bits: int
    txnid_least_bits: int
    error: ServerError
    message: str
    next_txnid_most_bits: int
    next_txnid_least_bits: int
    def __init__(self, request_id: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ..., next_txnid_most_bits: _Optional[int] = ..., next_txnid_least_bits: _Optional[int] = ...) -> None: ...

class CommandEndTxnOnPartition(_message.Message):
    __slots__ = ("request_id", "txnid_most_bits", "txnid_least_bits", "partition", "txn_action", "coordinator_slot_epoch", "coordinator_epoch", "producer_id", "producer_epoch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TXN_ACTION_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_SLOT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txnid_most_bits: int
    txnid_least_bits: int
    partition: PartitionRef
    txn_action: TxnAction
    coordinator_slot_epoch: int
    coordinator_epoch: int
    producer_id: int
    producer_epoch: int
    def __init__(self, request_id: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., partition: _Optional[_Union[PartitionRef, _Mapping]] = ..., txn_action: _Optional[_Union[TxnAction, str]] = ..., coordinator_slot_epoch: _Optional[int] = ..., coordinator_epoch: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class CommandEndTxnOnSubscription(_message.Message):
    __slots__ = ("request_id", "txnid_most_bits", "txnid_least_bits", "subscription", "txn_action", "coordinator_slot_epoch", "coordinator_epoch", "producer_id", "producer_epoch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TXN_ACTION_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_SLOT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txnid_most_bits: int
    txnid_least_bits: int
    subscription: SubscriptionRef
    txn_action: TxnAction
    coordinator_slot_epoch: int
    coordinator_epoch: int
    producer_id: int
    producer_epoch: int
    def __init__(self, request_id: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., subscription: _Optional[_Union[SubscriptionRef, _Mapping]] = ..., txn_action: _Optional[_Union[TxnAction, str]] = ..., coordinator_slot_epoch: _Optional[int] = ..., coordinator_epoch: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class TransactionMetadataEntry(_message.Message):
    __slots__ = ("metadata_op", "txnid_most_bits", "txnid_least_bits", "expected_status", "new_status", "partitions", "subscriptions", "txn_timeout_ms", "txn_start_time", "txn_last_modification_time", "timed_out", "boot_epoch", "producer_id", "producer_epoch", "two_phase", "producer", "tag", "prepared_timeout_ms", "group_id", "group_sequence", "group_duplicate", "group_updates", "commit_id")
    class TransactionMetadataOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NEW: _ClassVar[TransactionMetadataEntry.TransactionMetadataOp]
        UPDATE: _ClassVar[TransactionMetadataEntry.TransactionMetadataOp]
        BOOT: _ClassVar[TransactionMetadataEntry.TransactionMetadataOp]
        PRODUCER: _ClassVar[TransactionMetadataEntry.TransactionMetadataOp]
        PRODUCER_EXPIRED: _ClassVar[TransactionMetadataEntry.TransactionMetadataOp]
        GROUP: _ClassVar[TransactionMetadataEntry.TransactionMetadataOp]
        REGISTER: _ClassVar[TransactionMetadataEntry.TransactionMetadataOp]
    NEW: TransactionMetadataEntry.TransactionMetadataOp
    UPDATE: TransactionMetadataEntry.TransactionMetadataOp
    BOOT: TransactionMetadataEntry.TransactionMetadataOp
    PRODUCER: TransactionMetadataEntry.TransactionMetadataOp
    PRODUCER_EXPIRED: TransactionMetadataEntry.TransactionMetadataOp
    GROUP: TransactionMetadataEntry.TransactionMetadataOp
    REGISTER: TransactionMetadataEntry.TransactionMetadataOp
    METADATA_OP_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_STATUS_FIELD_NUMBER: _ClassVar[int]
    NEW_STATUS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    TXN_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TXN_START_TIME_FIELD_NUMBER: _ClassVar[int]
    TXN_LAST_MODIFICATION_TIME_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    BOOT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TWO_PHASE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PREPARED_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    GROUP_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_UPDATES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_ID_FIELD_NUMBER: _ClassVar[int]
    metadata_op: TransactionMetadataEntry.TransactionMetadataOp
    txnid_most_bits: int
    txnid_least_bits: int
    expected_status: TxnStatusValue
    new_status: TxnStatusValue
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionRef]
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionRef]
    txn_timeout_ms: int
    txn_start_time: int
    txn_last_modification_time: int
    timed_out: bool
    boot_epoch: int
    producer_id: int
    producer_epoch: int
    two_phase: bool
    producer: TransactionalProducer
    tag: str
    prepared_timeout_ms: int
    group_id: str
    group_sequence: int
    group_duplicate: bool
    group_updates: _containers.RepeatedCompositeFieldContainer[TransactionMetadataEntry]
    commit_id: int
    def __init__(self, metadata_op: _Optional[_Union[TransactionMetadataEntry.TransactionMetadataOp, str]] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., expected_status: _Optional[_Union[TxnStatusValue, str]] = ..., new_status: _Optional[_Union[TxnStatusValue, str]] = ..., partitions: _Optional[_Iterable[_Union[PartitionRef, _Mapping]]] = ..., subscriptions: _Optional[_Iterable[_Union[SubscriptionRef, _Mapping]]] = ..., txn_timeout_ms: _Optional[int] = ..., txn_start_time: _Optional[int] = ..., txn_last_modification_time: _Optional[int] = ..., timed_out: _Optional[bool] = ..., boot_epoch: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., two_phase: _Optional[bool] = ..., producer: _Optional[_Union[TransactionalProducer, _Mapping]] = ..., tag: _Optional[str] = ..., prepared_timeout_ms: _Optional[int] = ..., group_id: _Optional[str] = ..., group_sequence: _Optional[int] = ..., group_duplicate: _Optional[bool] = ..., group_updates: _Optional[_Iterable[_Union[TransactionMetadataEntry, _Mapping]]] = ..., commit_id: _Optional[int] = ...) -> None: ...

class TransactionalProducer(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "txn_producer_id", "txn_epoch", "ongoing_most_bits", "ongoing_least_bits", "has_ongoing", "prev_producer_id", "prev_epoch", "prev_outcome", "bumped_by", "timeout_ms", "two_phase", "updated_ms")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TXN_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    TXN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ONGOING_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    ONGOING_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    HAS_ONGOING_FIELD_NUMBER: _ClassVar[int]
    PREV_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PREV_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PREV_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    BUMPED_BY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TWO_PHASE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_producer_id: int
    txn_epoch: int
    ongoing_most_bits: int
    ongoing_least_bits: int
    has_ongoing: bool
    prev_producer_id: int
    prev_epoch: int
    prev_outcome: str
    bumped_by: str
    timeout_ms: int
    two_phase: bool
    updated_ms: int
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., txn_producer_id: _Optional[int] = ..., txn_epoch: _Optional[int] = ..., ongoing_most_bits: _Optional[int] = ..., ongoing_least_bits: _Optional[int] = ..., has_ongoing: _Optional[bool] = ..., prev_producer_id: _Optional[int] = ..., prev_epoch: _Optional[int] = ..., prev_outcome: _Optional[str] = ..., bumped_by: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., two_phase: _Optional[bool] = ..., updated_ms: _Optional[int] = ...) -> None: ...

class CommandInitProducerId(_message.Message):
    __slots__ = ("request_id", "transactional_id", "transaction_timeout_ms", "enable_2pc", "keep_prepared_txn")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ENABLE_2PC_FIELD_NUMBER: _ClassVar[int]
    KEEP_PREPARED_TXN_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    transactional_id: str
    transaction_timeout_ms: int
    enable_2pc: bool
    keep_prepared_txn: bool
    def __init__(self, request_id: _Optional[int] = ..., transactional_id: _Optional[str] = ..., transaction_timeout_ms: _Optional[int] = ..., enable_2pc: _Optional[bool] = ..., keep_prepared_txn: _Optional[bool] = ...) -> None: ...

class CommandInitProducerIdResponse(_message.Message):
    __slots__ = ("request_id", "producer_id", "producer_epoch", "ongoing_txn_producer_id", "ongoing_txn_epoch", "error", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ONGOING_TXN_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    ONGOING_TXN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    producer_id: int
    producer_epoch: int
    ongoing_txn_producer_id: int
    ongoing_txn_epoch: int
    error: ServerError
    message: str
    def __init__(self, request_id: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., ongoing_txn_producer_id: _Optional[int] = ..., ongoing_txn_epoch: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ...) -> None: ...

class CommandProduce(_message.Message):
    __slots__ = ("request_id", "topic", "partition", "producer_id", "producer_epoch", "first_sequence", "batch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    first_sequence: int
    batch: bytes
    def __init__(self, request_id: _Optional[int] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., first_sequence: _Optional[int] = ..., batch: _Optional[bytes] = ...) -> None: ...

class CommandProducerTxnResponse(_message.Message):
    __slots__ = ("request_id", "error", "message", "first_batch_index", "producer_id", "producer_epoch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIRST_BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: ServerError
    message: str
    first_batch_index: int
    producer_id: int
    producer_epoch: int
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ..., first_batch_index: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class CommandTxnOffsets(_message.Message):
    __slots__ = ("request_id", "consumer_id", "producer_id", "producer_epoch", "positions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    consumer_id: int
    producer_id: int
    producer_epoch: int
    positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[int] = ..., consumer_id: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., positions: _Optional[_Iterable[int]] = ...) -> None: ...

class CommandPrepareProducerTxn(_message.Message):
    __slots__ = ("request_id", "producer_id", "producer_epoch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    producer_id: int
    producer_epoch: int
    def __init__(self, request_id: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class CommandEndProducerTxn(_message.Message):
    __slots__ = ("request_id", "producer_id", "producer_epoch", "txn_action")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TXN_ACTION_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    producer_id: int
    producer_epoch: int
    txn_action: TxnAction
    def __init__(self, request_id: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., txn_action: _Optional[_Union[TxnAction, str]] = ...) -> None: ...

class TxnIdData(_message.Message):
    __slots__ = ("most_bits", "least_bits")
    MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    most_bits: int
    least_bits: int
    def __init__(self, most_bits: _Optional[int] = ..., least_bits: _Optional[int] = ...) -> None: ...

class CommandPrepareTxn(_message.Message):
    __slots__ = ("request_id", "txnid_most_bits", "txnid_least_bits")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    txnid_most_bits: int
    txnid_least_bits: int
    def __init__(self, request_id: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ...) -> None: ...

class CommandCommitGroup(_message.Message):
    __slots__ = ("request_id", "tc_id", "group", "sequence", "txns", "abort_tag")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TC_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TXNS_FIELD_NUMBER: _ClassVar[int]
    ABORT_TAG_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    tc_id: int
    group: str
    sequence: int
    txns: _containers.RepeatedCompositeFieldContainer[TxnIdData]
    abort_tag: str
    def __init__(self, request_id: _Optional[int] = ..., tc_id: _Optional[int] = ..., group: _Optional[str] = ..., sequence: _Optional[int] = ..., txns: _Optional[_Iterable[_Union[TxnIdData, _Mapping]]] = ..., abort_tag: _Optional[str] = ...) -> None: ...

class CommandAbortTagged(_message.Message):
    __slots__ = ("request_id", "tc_id", "tag", "prefix")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TC_ID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    tc_id: int
    tag: str
    prefix: bool
    def __init__(self, request_id: _Optional[int] = ..., tc_id: _Optional[int] = ..., tag: _Optional[str] = ..., prefix: _Optional[bool] = ...) -> None: ...

class CommandTxnGroupResponse(_message.Message):
    __slots__ = ("request_id", "error", "message", "duplicate", "committed", "aborted")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: ServerError
    message: str
    duplicate: bool
    committed: int
    aborted: int
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ..., duplicate: _Optional[bool] = ..., committed: _Optional[int] = ..., aborted: _Optional[int] = ...) -> None: ...

class PartitionPosition(_message.Message):
    __slots__ = ("partition", "entry_id", "index")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    partition: int
    entry_id: int
    index: int
    def __init__(self, partition: _Optional[int] = ..., entry_id: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class CommandReadEntries(_message.Message):
    __slots__ = ("request_id", "topic", "partition", "start_entry", "start_index", "end_entry", "end_index", "max_messages", "positions_only", "wait_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    START_ENTRY_FIELD_NUMBER: _ClassVar[int]
    START_INDEX_FIELD_NUMBER: _ClassVar[int]
    END_ENTRY_FIELD_NUMBER: _ClassVar[int]
    END_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_ONLY_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    topic: str
    partition: int
    start_entry: int
    start_index: int
    end_entry: int
    end_index: int
    max_messages: int
    positions_only: bool
    wait_ms: int
    def __init__(self, request_id: _Optional[int] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., start_entry: _Optional[int] = ..., start_index: _Optional[int] = ..., end_entry: _Optional[int] = ..., end_index: _Optional[int] = ..., max_messages: _Optional[int] = ..., positions_only: _Optional[bool] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class CommandReadEntriesResponse(_message.Message):
    __slots__ = ("request_id", "error", "message", "entries", "next_entry", "next_index", "messages", "first_entry", "end_entry")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_ENTRY_FIELD_NUMBER: _ClassVar[int]
    NEXT_INDEX_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    END_ENTRY_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: ServerError
    message: str
    entries: _containers.RepeatedCompositeFieldContainer[DeliveredEntry]
    next_entry: int
    next_index: int
    messages: int
    first_entry: int
    end_entry: int
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[DeliveredEntry, _Mapping]]] = ..., next_entry: _Optional[int] = ..., next_index: _Optional[int] = ..., messages: _Optional[int] = ..., first_entry: _Optional[int] = ..., end_entry: _Optional[int] = ...) -> None: ...

class CommandCursor(_message.Message):
    __slots__ = ("request_id", "topic", "subscription", "initial_position", "acknowledge_before")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INITIAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGE_BEFORE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    topic: str
    subscription: str
    initial_position: CommandSubscribe.InitialPosition
    acknowledge_before: _containers.RepeatedCompositeFieldContainer[PartitionPosition]
    def __init__(self, request_id: _Optional[int] = ..., topic: _Optional[str] = ..., subscription: _Optional[str] = ..., initial_position: _Optional[_Union[CommandSubscribe.InitialPosition, str]] = ..., acknowledge_before: _Optional[_Iterable[_Union[PartitionPosition, _Mapping]]] = ...) -> None: ...

class CommandCursorResponse(_message.Message):
    __slots__ = ("request_id", "error", "message", "positions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: ServerError
    message: str
    positions: _containers.RepeatedCompositeFieldContainer[PartitionPosition]
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ..., positions: _Optional[_Iterable[_Union[PartitionPosition, _Mapping]]] = ...) -> None: ...

class CursorAt(_message.Message):
    __slots__ = ("topic", "partition", "entry_id", "index", "none", "error", "message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    entry_id: int
    index: int
    none: bool
    error: ServerError
    message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., entry_id: _Optional[int] = ..., index: _Optional[int] = ..., none: _Optional[bool] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ...) -> None: ...

class CommandGroupCursors(_message.Message):
    __slots__ = ("request_id", "subscription", "commit", "positions", "all", "producer_id", "producer_epoch", "transactional_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    subscription: str
    commit: bool
    positions: _containers.RepeatedCompositeFieldContainer[CursorAt]
    all: bool
    producer_id: int
    producer_epoch: int
    transactional_id: str
    def __init__(self, request_id: _Optional[int] = ..., subscription: _Optional[str] = ..., commit: _Optional[bool] = ..., positions: _Optional[_Iterable[_Union[CursorAt, _Mapping]]] = ..., all: _Optional[bool] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., transactional_id: _Optional[str] = ...) -> None: ...

class CommandGroupCursorsResponse(_message.Message):
    __slots__ = ("request_id", "error", "message", "positions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: ServerError
    message: str
    positions: _containers.RepeatedCompositeFieldContainer[CursorAt]
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[ServerError, str]] = ..., message: _Optional[str] = ..., positions: _Optional[_Iterable[_Union[CursorAt, _Mapping]]] = ...) -> None: ...

class CommandBatch(_message.Message):
    __slots__ = ("commands",)
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[BaseCommand]
    def __init__(self, commands: _Optional[_Iterable[_Union[BaseCommand, _Mapping]]] = ...) -> None: ...

class BaseCommand(_message.Message):
    __slots__ = ("type", "connect", "connected", "partitioned_metadata", "partitioned_metadata_response", "lookup", "lookup_response", "producer", "producer_success", "close_producer", "send", "send_receipt", "send_error", "subscribe", "flow", "message", "ack", "ack_response", "redeliver_unacknowledged", "close_consumer", "active_consumer_change", "success", "error", "ping", "pong", "new_txn", "new_txn_response", "add_partition_to_txn", "add_subscription_to_txn", "end_txn", "txn_response", "end_txn_on_partition", "end_txn_on_subscription", "batch", "commit_txn", "prepare_txn", "commit_group", "abort_tagged", "txn_group_response", "init_producer_id", "init_producer_id_response", "produce", "producer_txn_response", "txn_offsets", "prepare_producer_txn", "end_producer_txn", "read_entries", "read_entries_response", "cursor", "cursor_response", "group_cursors", "group_cursors_response", "seek", "unsubscribe")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[BaseCommand.Type]
        CONNECT: _ClassVar[BaseCommand.Type]
        CONNECTED: _ClassVar[BaseCommand.Type]
        PARTITIONED_METADATA: _ClassVar[BaseCommand.Type]
        PARTITIONED_METADATA_RESPONSE: _ClassVar[BaseCommand.Type]
        LOOKUP: _ClassVar[BaseCommand.Type]
        LOOKUP_RESPONSE: _ClassVar[BaseCommand.Type]
        PRODUCER: _ClassVar[BaseCommand.Type]
        PRODUCER_SUCCESS: _ClassVar[BaseCommand.Type]
        CLOSE_PRODUCER: _ClassVar[BaseCommand.Type]
        SEND: _ClassVar[BaseCommand.Type]
        SEND_RECEIPT: _ClassVar[BaseCommand.Type]
        SEND_ERROR: _ClassVar[BaseCommand.Type]
        SUBSCRIBE: _ClassVar[BaseCommand.Type]
        FLOW: _ClassVar[BaseCommand.Type]
        MESSAGE: _ClassVar[BaseCommand.Type]
        ACK: _ClassVar[BaseCommand.Type]
        ACK_RESPONSE: _ClassVar[BaseCommand.Type]
        REDELIVER_UNACKNOWLEDGED: _ClassVar[BaseCommand.Type]
        CLOSE_CONSUMER: _ClassVar[BaseCommand.Type]
        ACTIVE_CONSUMER_CHANGE: _ClassVar[BaseCommand.Type]
        SUCCESS: _ClassVar[BaseCommand.Type]
        ERROR: _ClassVar[BaseCommand.Type]
        PING: _ClassVar[BaseCommand.Type]
        PONG: _ClassVar[BaseCommand.Type]
        NEW_TXN: _ClassVar[BaseCommand.Type]
        NEW_TXN_RESPONSE: _ClassVar[BaseCommand.Type]
        ADD_PARTITION_TO_TXN: _ClassVar[BaseCommand.Type]
        ADD_SUBSCRIPTION_TO_TXN: _ClassVar[BaseCommand.Type]
        END_TXN: _ClassVar[BaseCommand.Type]
        TXN_RESPONSE: _ClassVar[BaseCommand.Type]
        END_TXN_ON_PARTITION: _ClassVar[BaseCommand.Type]
        END_TXN_ON_SUBSCRIPTION: _ClassVar[BaseCommand.Type]
        BATCH: _ClassVar[BaseCommand.Type]
        COMMIT_TXN: _ClassVar[BaseCommand.Type]
        PREPARE_TXN: _ClassVar[BaseCommand.Type]
        COMMIT_GROUP: _ClassVar[BaseCommand.Type]
        ABORT_TAGGED: _ClassVar[BaseCommand.Type]
        TXN_GROUP_RESPONSE: _ClassVar[BaseCommand.Type]
        INIT_PRODUCER_ID: _ClassVar[BaseCommand.Type]
        INIT_PRODUCER_ID_RESPONSE: _ClassVar[BaseCommand.Type]
        PRODUCE: _ClassVar[BaseCommand.Type]
        PRODUCER_TXN_RESPONSE: _ClassVar[BaseCommand.Type]
        TXN_OFFSETS: _ClassVar[BaseCommand.Type]
        PREPARE_PRODUCER_TXN: _ClassVar[BaseCommand.Type]
        END_PRODUCER_TXN: _ClassVar[BaseCommand.Type]
        READ_ENTRIES: _ClassVar[BaseCommand.Type]
        READ_ENTRIES_RESPONSE: _ClassVar[BaseCommand.Type]
        CURSOR: _ClassVar[BaseCommand.Type]
        CURSOR_RESPONSE: _ClassVar[BaseCommand.Type]
        GROUP_CURSORS: _ClassVar[BaseCommand.Type]
        GROUP_CURSORS_RESPONSE: _ClassVar[BaseCommand.Type]
        SEEK: _ClassVar[BaseCommand.Type]
        UNSUBSCRIBE: _ClassVar[BaseCommand.Type]
    TYPE_UNSPECIFIED: BaseCommand.Type
    CONNECT: BaseCommand.Type
    CONNECTED: BaseCommand.Type
    PARTITIONED_METADATA: BaseCommand.Type
    PARTITIONED_METADATA_RESPONSE: BaseCommand.Type
    LOOKUP: BaseCommand.Type
    LOOKUP_RESPONSE: BaseCommand.Type
    PRODUCER: BaseCommand.Type
    PRODUCER_SUCCESS: BaseCommand.Type
    CLOSE_PRODUCER: BaseCommand.Type
    SEND: BaseCommand.Type
    SEND_RECEIPT: BaseCommand.Type
    SEND_ERROR: BaseCommand.Type
    SUBSCRIBE: BaseCommand.Type
    FLOW: BaseCommand.Type
    MESSAGE: BaseCommand.Type
    ACK: BaseCommand.Type
    ACK_RESPONSE: BaseCommand.Type
    REDELIVER_UNACKNOWLEDGED: BaseCommand.Type
    CLOSE_CONSUMER: BaseCommand.Type
    ACTIVE_CONSUMER_CHANGE: BaseCommand.Type
    SUCCESS: BaseCommand.Type
    ERROR: BaseCommand.Type
    PING: BaseCommand.Type
    PONG: BaseCommand.Type
    NEW_TXN: BaseCommand.Type
    NEW_TXN_RESPONSE: BaseCommand.Type
    ADD_PARTITION_TO_TXN: BaseCommand.Type
    ADD_SUBSCRIPTION_TO_TXN: BaseCommand.Type
    END_TXN: BaseCommand.Type
    TXN_RESPONSE: BaseCommand.Type
    END_TXN_ON_PARTITION: BaseCommand.Type
    END_TXN_ON_SUBSCRIPTION: BaseCommand.Type
    BATCH: BaseCommand.Type
    COMMIT_TXN: BaseCommand.Type
    PREPARE_TXN: BaseCommand.Type
    COMMIT_GROUP: BaseCommand.Type
    ABORT_TAGGED: BaseCommand.Type
    TXN_GROUP_RESPONSE: BaseCommand.Type
    INIT_PRODUCER_ID: BaseCommand.Type
    INIT_PRODUCER_ID_RESPONSE: BaseCommand.Type
    PRODUCE: BaseCommand.Type
    PRODUCER_TXN_RESPONSE: BaseCommand.Type
    TXN_OFFSETS: BaseCommand.Type
    PREPARE_PRODUCER_TXN: BaseCommand.Type
    END_PRODUCER_TXN: BaseCommand.Type
    READ_ENTRIES: BaseCommand.Type
    READ_ENTRIES_RESPONSE: BaseCommand.Type
    CURSOR: BaseCommand.Type
    CURSOR_RESPONSE: BaseCommand.Type
    GROUP_CURSORS: BaseCommand.Type
    GROUP_CURSORS_RESPONSE: BaseCommand.Type
    SEEK: BaseCommand.Type
    UNSUBSCRIBE: BaseCommand.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CONNECT_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    PARTITIONED_METADATA_FIELD_NUMBER: _ClassVar[int]
    PARTITIONED_METADATA_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SUCCESS_FIELD_NUMBER: _ClassVar[int]
    CLOSE_PRODUCER_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    SEND_RECEIPT_FIELD_NUMBER: _ClassVar[int]
    SEND_ERROR_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    ACK_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REDELIVER_UNACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    CLOSE_CONSUMER_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONSUMER_CHANGE_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    NEW_TXN_FIELD_NUMBER: _ClassVar[int]
    NEW_TXN_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ADD_PARTITION_TO_TXN_FIELD_NUMBER: _ClassVar[int]
    ADD_SUBSCRIPTION_TO_TXN_FIELD_NUMBER: _ClassVar[int]
    END_TXN_FIELD_NUMBER: _ClassVar[int]
    TXN_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    END_TXN_ON_PARTITION_FIELD_NUMBER: _ClassVar[int]
    END_TXN_ON_SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TXN_FIELD_NUMBER: _ClassVar[int]
    PREPARE_TXN_FIELD_NUMBER: _ClassVar[int]
    COMMIT_GROUP_FIELD_NUMBER: _ClassVar[int]
    ABORT_TAGGED_FIELD_NUMBER: _ClassVar[int]
    TXN_GROUP_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    INIT_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    INIT_PRODUCER_ID_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_TXN_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    TXN_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    PREPARE_PRODUCER_TXN_FIELD_NUMBER: _ClassVar[int]
    END_PRODUCER_TXN_FIELD_NUMBER: _ClassVar[int]
    READ_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    READ_ENTRIES_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    CURSOR_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    GROUP_CURSORS_FIELD_NUMBER: _ClassVar[int]
    GROUP_CURSORS_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    SEEK_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    type: BaseCommand.Type
    connect: CommandConnect
    connected: CommandConnected
    partitioned_metadata: CommandPartitionedMetadata
    partitioned_metadata_response: CommandPartitionedMetadataResponse
    lookup: CommandLookupTopic
    lookup_response: CommandLookupTopicResponse
    producer: CommandProducer
    producer_success: CommandProducerSuccess
    close_producer: CommandCloseProducer
    send: CommandSend
    send_receipt: CommandSendReceipt
    send_error: CommandSendError
    subscribe: CommandSubscribe
    flow: CommandFlow
    message: CommandMessage
    ack: CommandAck
    ack_response: CommandAckResponse
    redeliver_unacknowledged: CommandRedeliverUnacknowledged
    close_consumer: CommandCloseConsumer
    active_consumer_change: CommandActiveConsumerChange
    success: CommandSuccess
    error: CommandError
    ping: CommandPing
    pong: CommandPong
    new_txn: CommandNewTxn
    new_txn_response: CommandNewTxnResponse
    add_partition_to_txn: CommandAddPartitionToTxn
    add_subscription_to_txn: CommandAddSubscriptionToTxn
    end_txn: CommandEndTxn
    txn_response: CommandTxnResponse
    end_txn_on_partition: CommandEndTxnOnPartition
    end_txn_on_subscription: CommandEndTxnOnSubscription
    batch: CommandBatch
    commit_txn: CommandCommitTxn
    prepare_txn: CommandPrepareTxn
    commit_group: CommandCommitGroup
    abort_tagged: CommandAbortTagged
    txn_group_response: CommandTxnGroupResponse
    init_producer_id: CommandInitProducerId
    init_producer_id_response: CommandInitProducerIdResponse
    produce: CommandProduce
    producer_txn_response: CommandProducerTxnResponse
    txn_offsets: CommandTxnOffsets
    prepare_producer_txn: CommandPrepareProducerTxn
    end_producer_txn: CommandEndProducerTxn
    read_entries: CommandReadEntries
    read_entries_response: CommandReadEntriesResponse
    cursor: CommandCursor
    cursor_response: CommandCursorResponse
    group_cursors: CommandGroupCursors
    group_cursors_response: CommandGroupCursorsResponse
    seek: CommandSeek
    unsubscribe: CommandUnsubscribe
    def __init__(self, type: _Optional[_Union[BaseCommand.Type, str]] = ..., connect: _Optional[_Union[CommandConnect, _Mapping]] = ..., connected: _Optional[_Union[CommandConnected, _Mapping]] = ..., partitioned_metadata: _Optional[_Union[CommandPartitionedMetadata, _Mapping]] = ..., partitioned_metadata_response: _Optional[_Union[CommandPartitionedMetadataResponse, _Mapping]] = ..., lookup: _Optional[_Union[CommandLookupTopic, _Mapping]] = ..., lookup_response: _Optional[_Union[CommandLookupTopicResponse, _Mapping]] = ..., producer: _Optional[_Union[CommandProducer, _Mapping]] = ..., producer_success: _Optional[_Union[CommandProducerSuccess, _Mapping]] = ..., close_producer: _Optional[_Union[CommandCloseProducer, _Mapping]] = ..., send: _Optional[_Union[CommandSend, _Mapping]] = ..., send_receipt: _Optional[_Union[CommandSendReceipt, _Mapping]] = ..., send_error: _Optional[_Union[CommandSendError, _Mapping]] = ..., subscribe: _Optional[_Union[CommandSubscribe, _Mapping]] = ..., flow: _Optional[_Union[CommandFlow, _Mapping]] = ..., message: _Optional[_Union[CommandMessage, _Mapping]] = ..., ack: _Optional[_Union[CommandAck, _Mapping]] = ..., ack_response: _Optional[_Union[CommandAckResponse, _Mapping]] = ..., redeliver_unacknowledged: _Optional[_Union[CommandRedeliverUnacknowledged, _Mapping]] = ..., close_consumer: _Optional[_Union[CommandCloseConsumer, _Mapping]] = ..., active_consumer_change: _Optional[_Union[CommandActiveConsumerChange, _Mapping]] = ..., success: _Optional[_Union[CommandSuccess, _Mapping]] = ..., error: _Optional[_Union[CommandError, _Mapping]] = ..., ping: _Optional[_Union[CommandPing, _Mapping]] = ..., pong: _Optional[_Union[CommandPong, _Mapping]] = ..., new_txn: _Optional[_Union[CommandNewTxn, _Mapping]] = ..., new_txn_response: _Optional[_Union[CommandNewTxnResponse, _Mapping]] = ..., add_partition_to_txn: _Optional[_Union[CommandAddPartitionToTxn, _Mapping]] = ..., add_subscription_to_txn: _Optional[_Union[CommandAddSubscriptionToTxn, _Mapping]] = ..., end_txn: _Optional[_Union[CommandEndTxn, _Mapping]] = ..., txn_response: _Optional[_Union[CommandTxnResponse, _Mapping]] = ..., end_txn_on_partition: _Optional[_Union[CommandEndTxnOnPartition, _Mapping]] = ..., end_txn_on_subscription: _Optional[_Union[CommandEndTxnOnSubscription, _Mapping]] = ..., batch: _Optional[_Union[CommandBatch, _Mapping]] = ..., commit_txn: _Optional[_Union[CommandCommitTxn, _Mapping]] = ..., prepare_txn: _Optional[_Union[CommandPrepareTxn, _Mapping]] = ..., commit_group: _Optional[_Union[CommandCommitGroup, _Mapping]] = ..., abort_tagged: _Optional[_Union[CommandAbortTagged, _Mapping]] = ..., txn_group_response: _Optional[_Union[CommandTxnGroupResponse, _Mapping]] = ..., init_producer_id: _Optional[_Union[CommandInitProducerId, _Mapping]] = ..., init_producer_id_response: _Optional[_Union[CommandInitProducerIdResponse, _Mapping]] = ..., produce: _Optional[_Union[CommandProduce, _Mapping]] = ..., producer_txn_response: _Optional[_Union[CommandProducerTxnResponse, _Mapping]] = ..., txn_offsets: _Optional[_Union[CommandTxnOffsets, _Mapping]] = ..., prepare_producer_txn: _Optional[_Union[CommandPrepareProducerTxn, _Mapping]] = ..., end_producer_txn: _Optional[_Union[CommandEndProducerTxn, _Mapping]] = ..., read_entries: _Optional[_Union[CommandReadEntries, _Mapping]] = ..., read_entries_response: _Optional[_Union[CommandReadEntriesResponse, _Mapping]] = ..., cursor: _Optional[_Union[CommandCursor, _Mapping]] = ..., cursor_response: _Optional[_Union[CommandCursorResponse, _Mapping]] = ..., group_cursors: _Optional[_Union[CommandGroupCursors, _Mapping]] = ..., group_cursors_response: _Optional[_Union[CommandGroupCursorsResponse, _Mapping]] = ..., seek: _Optional[_Union[CommandSeek, _Mapping]] = ..., unsubscribe: _Optional[_Union[CommandUnsubscribe, _Mapping]] = ...) -> None: ...
