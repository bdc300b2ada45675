"""The micro-batcher's queue: pending items (an encoded example and the future its caller awaits),
the tokens they hold, and how a batch is formed from them (by size, or at a deadline once traffic
is concurrent). Used by :class:`dialogue_safety.service.batcher.MicroBatcher`, which bounds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.schema import Prediction


@dataclass(slots=True)
class Pending:
    encoded: EncodedExample
    future: asyncio.Future[Prediction]
    enqueued: float  # loop.time() when the submission arrived (before encoding)
    own_wait: float = 0.0  # predicted time of its own submission's batches ahead of it (not waiting for others)


class BatchQueue:
    """An ``asyncio.Queue`` of :class:`Pending` items with the tokens they hold (``tokens``).
    ``on_dropped(n)``: items whose caller went away were dropped when reached."""

    def __init__(self, max_items: int, on_dropped: Callable[[int], None]) -> None:
        self._queue: asyncio.Queue[Pending] = asyncio.Queue(maxsize=max_items)
        self._on_dropped = on_dropped
        self.tokens = 0

    def __len__(self) -> int:
        return self._queue.qsize()

    def live(self) -> int:
        """Items waiting whose caller still waits (cancelled ones are dropped when reached)."""
        waiting: list[Pending] = list(self._queue._queue)  # type: ignore[attr-defined]
        return sum(1 for item in waiting if not item.future.done())

    def put(self, item: Pending) -> None:
        self._queue.put_nowait(item)
        self.tokens += item.encoded.tokens

    def take_all(self) -> list[Pending]:
        """Empty the queue (stopping)."""
        items = []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        self.tokens = 0
        return items

    def _take(self, batch: list[Pending], item: Pending) -> None:
        self.tokens -= item.encoded.tokens
        if item.future.done():  # its caller is gone
            self._on_dropped(1)
        else:
            batch.append(item)

    async def next_batch(
        self, max_size: int, wait_s: float, on_cancel: Callable[[list[Pending]], None]
    ) -> list[Pending]:
        """The first live item, what is queued, then, with ``wait_s`` > 0, what arrives until the batch
        holds ``max_size`` items or ``wait_s`` after its first item arrived. Cancelled while waiting
        for company: ``on_cancel(items taken)`` (their callers must not wait for ever), then raises."""
        batch: list[Pending] = []
        while not batch:
            self._take(batch, await self._queue.get())
        while len(batch) < max_size and not self._queue.empty():
            self._take(batch, self._queue.get_nowait())
        if len(batch) >= max_size or wait_s <= 0:
            return batch
        try:
            async with asyncio.timeout_at(batch[0].enqueued + wait_s):
                while len(batch) < max_size:
                    self._take(batch, await self._queue.get())  # cancellation-safe: no item is lost
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            on_cancel(batch)
            raise
        return batch
