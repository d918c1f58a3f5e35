"""Per-partition storage: topics, partition ledgers, deduplication, transactions.

A partition's transaction buffer (PIP-31 §Sidecar Approach) is its sidecar
transaction log with the transaction index, commit markers, materialization
and sweep: `TransactionBuffer`, reached through `Partition.txn_buffer()`.
"""

from buffer._entries import (
    COMMIT_MARKER,
    DATA,
    DuplicateTooOldError,
    PublishResult,
    SendRejectedError,
    entry_count,
    entry_kind,
    entry_meta,
    txn_run_start,
)
from buffer._names import (
    MAX_PARTITIONS,
    InvalidNameError,
    MessageId,
    Position,
    check_subscription_name,
    check_topic_name,
)
from buffer._partition import Partition
from buffer._retention import NO_RETENTION, Retention, RetentionError
from buffer._topics import PartitionCountError, Topic, Topics, partition_ledger_prefixes
from buffer._txnbuffer import (
    EpochProducer,
    OutOfOrderSequenceError,
    StaleEpochError,
    TransactionBuffer,
    TransactionBufferError,
    TxnConflictError,
    TxnEndedError,
    TxnInfo,
    TxnKey,
    TxnState,
    epoch_producer_name,
    sidecar_ledger_name,
)

__all__ = [
    "COMMIT_MARKER",
    "DATA",
    "MAX_PARTITIONS",
    "NO_RETENTION",
    "DuplicateTooOldError",
    "EpochProducer",
    "InvalidNameError",
    "MessageId",
    "OutOfOrderSequenceError",
    "Partition",
    "PartitionCountError",
    "Position",
    "PublishResult",
    "Retention",
    "RetentionError",
    "SendRejectedError",
    "StaleEpochError",
    "Topic",
    "Topics",
    "TransactionBuffer",
    "TransactionBufferError",
    "TxnConflictError",
    "TxnEndedError",
    "TxnInfo",
    "TxnKey",
    "TxnState",
    "check_subscription_name",
    "check_topic_name",
    "entry_count",
    "entry_kind",
    "entry_meta",
    "epoch_producer_name",
    "partition_ledger_prefixes",
    "sidecar_ledger_name",
    "txn_run_start",
]
