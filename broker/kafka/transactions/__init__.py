"""Transactions (KIP-98): the transaction coordinator and its log.

- `log.py`: the records written to `__transaction_state` (Kafka's key/value layouts).
- `state.py`: TxnMetadata and the rules every transactional request is checked against.
- `coordinator.py`: TransactionCoordinator, the asyncio shell: partition election, durable
  state changes before replies, markers, timeouts.
- `markers.py`: writing transaction markers locally and WriteTxnMarkers to other brokers.

What a partition knows of transactions (open ones, aborted ranges, the last stable offset) is
`kafka/txn_state.py`; pending transactional offsets are the group coordinator's.
"""
