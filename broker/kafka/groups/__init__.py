"""Consumer groups: the classic group protocol and committed offsets, durable in `__consumer_offsets`.

- `state.py`: the protocol as a pure state machine (GroupManager), driven by requests and a clock.
- `log.py`: the records written to `__consumer_offsets` (Kafka's key/value layouts) in v2 batches.
- `coordinator.py`: GroupCoordinator, the asyncio shell: partition election/resignation,
  durable appends before replies, timers.
"""

from automq.broker.kafka.groups.coordinator import GroupCoordinator

__all__ = ("GroupCoordinator",)
