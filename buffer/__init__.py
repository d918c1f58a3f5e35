"""Per-partition storage: topics, partition ledgers, deduplication.

The transaction buffer (sidecar transaction logs, commit markers,
materialization, sweep) joins this package with PIP-31 (issue 3).
"""

from buffer._names import (
    MAX_PARTITIONS,
    InvalidNameError,
    MessageId,
    Position,
    check_subscription_name,
    check_topic_name,
)
from buffer._partition import (
    COMMIT_MARKER,
    DATA,
    DuplicateTooOldError,
    Partition,
    PublishResult,
    SendRejectedError,
    entry_count,
    entry_kind,
    entry_meta,
)
from buffer._topics import PartitionCountError, Topic, Topics

__all__ = [
    "COMMIT_MARKER",
    "DATA",
    "MAX_PARTITIONS",
    "DuplicateTooOldError",
    "InvalidNameError",
    "MessageId",
    "Partition",
    "PartitionCountError",
    "Position",
    "PublishResult",
    "SendRejectedError",
    "Topic",
    "Topics",
    "check_subscription_name",
    "check_topic_name",
    "entry_count",
    "entry_kind",
    "entry_meta",
]
