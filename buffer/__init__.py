"""Per-partition storage: topics, partition ledgers, deduplication, transactions.

A partition's transaction buffer (PIP-31 §Sidecar Approach) is its sidecar
transaction log with the transaction index, commit markers, materialization
and sweep: `TransactionBuffer`, reached through `Partition.txn_buffer()`.
What it refuses it raises as its own errors, each with one parent
(`InvalidNameError`, `SendRejectedError`, the `TransactionBufferError`
classes, ...), or as `proto.refusals` classes; the broker answers each with
its wire code from one table (`broker._errors.WIRE_CODES`).
"""

from buffer._entries import (
    COMMIT_MARKER,
    COMMITTED_TXN,
    DATA,
    DUPLICATE_POSITION,
    DuplicateTooOldError,
    MalformedSendError,
    PublishResult,
    SendRejectedError,
    committed_entry,
    decode_send,
    entry_count,
    entry_kind,
    entry_meta,
    send_sequence_ids,
    txn_run_start,
)
from buffer._names import (
    MAX_PARTITIONS,
    QUOTE_LIMIT,
    InvalidNameError,
    InvalidTopicNameError,
    MessageId,
    Position,
    check_consumer_name,
    check_producer_name,
    check_subscription_name,
    check_topic_name,
    quoted,
)
from buffer._partition import Partition
from buffer._retention import NO_RETENTION, Retention, RetentionError
from buffer._sidecar import (
    TXN_ABORT,
    TXN_COMMIT,
    TXN_DATA,
    TXN_SNAPSHOT,
    CommitMarker,
    SidecarRecord,
    TxnAbort,
    TxnCommit,
    TxnData,
    TxnSnapshot,
    decode_sidecar_record,
    sidecar_ledger_name,
)
from buffer._topics import PartitionCountError, Topic, Topics, partition_ledger_prefixes
from buffer._txnbuffer import TransactionBuffer
from buffer._txnindex import EpochProducer, TxnInfo, epoch_producer_name
from buffer._txnstate import (
    OutOfOrderSequenceError,
    PartitionTxnEvent,
    PartitionTxnState,
    StaleEpochError,
    TransactionBufferError,
    TxnConflictError,
    TxnEndedError,
)

__all__ = [
    "COMMITTED_TXN",
    "COMMIT_MARKER",
    "DATA",
    "DUPLICATE_POSITION",
    "MAX_PARTITIONS",
    "NO_RETENTION",
    "QUOTE_LIMIT",
    "TXN_ABORT",
    "TXN_COMMIT",
    "TXN_DATA",
    "TXN_SNAPSHOT",
    "CommitMarker",
    "DuplicateTooOldError",
    "EpochProducer",
    "InvalidNameError",
    "InvalidTopicNameError",
    "MalformedSendError",
    "MessageId",
    "OutOfOrderSequenceError",
    "Partition",
    "PartitionCountError",
    "PartitionTxnEvent",
    "PartitionTxnState",
    "Position",
    "PublishResult",
    "Retention",
    "RetentionError",
    "SendRejectedError",
    "SidecarRecord",
    "StaleEpochError",
    "Topic",
    "Topics",
    "TransactionBuffer",
    "TransactionBufferError",
    "TxnAbort",
    "TxnCommit",
    "TxnConflictError",
    "TxnData",
    "TxnEndedError",
    "TxnInfo",
    "TxnSnapshot",
    "check_consumer_name",
    "check_producer_name",
    "check_subscription_name",
    "check_topic_name",
    "committed_entry",
    "decode_send",
    "decode_sidecar_record",
    "entry_count",
    "entry_kind",
    "entry_meta",
    "epoch_producer_name",
    "partition_ledger_prefixes",
    "quoted",
    "send_sequence_ids",
    "sidecar_ledger_name",
    "txn_run_start",
]
