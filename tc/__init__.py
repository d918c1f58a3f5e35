"""The transaction coordinator (PIP-31 §Transaction Coordinator).

For now: the `TxnID`. The coordinator itself (transaction log, status
table, timeouts, recovery) arrives with issue 3.
"""

from tc._txnid import TxnID

__all__ = ["TxnID"]
