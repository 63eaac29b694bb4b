"""A partition's leader-epoch history: which leader epoch wrote which offsets (Kafka's
leader-epoch cache, KIP-101/KIP-279/KIP-320).

Here it needs no file of its own: a partition's stream is opened with stream epoch = leader
epoch, and the controller keeps one range per (epoch, owner) with the offset it started at
(`StreamMetadata.epochs`), so the history comes with every open, durable in the controller's
log, the same after a move, a restart or a recovery on another broker. A leader adds its own
epoch at the log end when it opens the partition, as a Kafka leader does when elected.

Pure and synchronous: OffsetForLeaderEpoch, Fetch's diverging epoch (v12+) and ListOffsets'
leader epochs are answered from it without I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochHistory:
    """(epoch, start offset) entries, epochs and start offsets strictly increasing."""

    __slots__ = ("_epochs", "_starts")

    def __init__(self, entries: Iterable[tuple[int, int]] = ()) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in entries:
            self.assign(epoch, start)

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> None:
        """Epoch `epoch` starts at `start_offset`. As in Kafka, entries it supersedes go: any
        with an epoch >= `epoch`, or a start offset >= `start_offset` (an epoch that never
        appended a record leaves no trace once the next one starts at the same offset)."""
        if epoch < 0 or start_offset < 0:
            return
        if self._epochs and self._epochs[-1] == epoch and self._starts[-1] <= start_offset:
            return  # already known (a reopen under the same epoch)
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)

    def end_offset_for(self, requested_epoch: int, log_end_offset: int, log_start_offset: int = 0) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (the largest epoch <= requested_epoch, the offset where it ended
        = the start of the next epoch, or the log end for the latest), Kafka's answers for the
        edge cases included: an unknown (newer) or undefined epoch gives (-1, -1); an epoch older
        than the history gives (requested_epoch, start of the first epoch kept). Epochs whose
        offsets are all below the log start are forgotten (Kafka truncates its cache from the
        start the same way)."""
        epochs, starts = self._clamped(log_start_offset)
        if requested_epoch == UNDEFINED_EPOCH or not epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested_epoch == epochs[-1]:
            return requested_epoch, log_end_offset
        higher = bisect.bisect_right(epochs, requested_epoch)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET  # newer than anything this log knows
        if higher == 0:
            return requested_epoch, starts[0]
        return epochs[higher - 1], starts[higher]

    def epoch_at(self, offset: int) -> int:
        """The epoch that wrote `offset` (-1 before the first known epoch)."""
        i = bisect.bisect_right(self._starts, offset)
        return self._epochs[i - 1] if i else UNDEFINED_EPOCH

    def _clamped(self, log_start_offset: int) -> tuple[list[int], list[int]]:
        starts = self._starts
        # the first entry kept is the last one starting at or below the log start
        first = max(0, bisect.bisect_right(starts, log_start_offset) - 1)
        if first == 0 and (not starts or starts[0] >= log_start_offset):
            return self._epochs, starts
        kept_starts = [max(starts[first], log_start_offset), *starts[first + 1 :]]
        return self._epochs[first:], kept_starts

    def __repr__(self) -> str:
        return f"LeaderEpochHistory({self.entries!r})"
