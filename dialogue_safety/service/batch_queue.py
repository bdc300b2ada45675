"""The micro-batcher's queue: pending items (an encoded example, the future its caller awaits and the
admission charge it holds) in two lanes, and how a batch is formed from them (by size, or at a deadline
once traffic is concurrent). Classification items go first; explanation items fill what room is left,
so that a long explanation never stands in front of a classification. Within a lane the clients take
turns, one item each, in the order they arrived: a client's large request fills the batches only while
nobody else waits, and another client's items join the next batch instead of waiting behind it all. Used by
:class:`dialogue_safety.service.batcher.MicroBatcher`; admission (:mod:`dialogue_safety.service.admission`)
bounds what it holds.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.schema import Prediction
from dialogue_safety.service.admission import CLASSIFY, EXPLAIN, Charge, LaneName


@dataclass(slots=True)
class Pending:
    encoded: EncodedExample
    future: asyncio.Future[Prediction]
    enqueued: float  # loop.time() when the submission arrived (before encoding)
    charge: Charge | None = None  # its request's admission charge; this item's tokens go back when it settles
    lane: LaneName = CLASSIFY


class BatchQueue:
    """The pending items of both lanes, each lane a queue per client (arrival order within a client).
    ``on_dropped(n)``: items whose caller went away were dropped when reached."""

    def __init__(self, on_dropped: Callable[[int], None]) -> None:
        self._lanes: dict[LaneName, OrderedDict[str, deque[Pending]]] = {
            CLASSIFY: OrderedDict(),
            EXPLAIN: OrderedDict(),
        }
        self._size = 0
        self._arrived = asyncio.Event()
        self._on_dropped = on_dropped

    def __len__(self) -> int:
        return self._size

    def _items(self) -> Iterator[Pending]:
        return (item for lane in self._lanes.values() for q in lane.values() for item in q)

    def live(self) -> int:
        """Items waiting whose caller still waits (cancelled ones are dropped when reached)."""
        return sum(1 for item in self._items() if not item.future.done())

    def put(self, item: Pending) -> None:
        client = item.charge.client if item.charge is not None else ""
        self._lanes[item.lane].setdefault(client, deque()).append(item)
        self._size += 1
        self._arrived.set()

    def take_all(self) -> list[Pending]:
        """Empty the queue (stopping)."""
        items = list(self._items())
        for lane in self._lanes.values():
            lane.clear()
        self._size = 0
        return items

    def _fill(self, batch: list[Pending], max_size: int, max_tokens: int | None = None) -> bool:
        """Move items into ``batch`` (classification first; the clients of a lane in turn, one item each)
        until it holds ``max_size`` items or, with ``max_tokens``, the next item's work (its tokens, every
        window and pass) would take it past that (a first item always goes in); drop the abandoned.
        True when the batch is full."""
        work = sum(item.encoded.tokens for item in batch)  # the batch's work so far (it may be refilled)
        for lane in self._lanes.values():
            while lane and len(batch) < max_size:
                client, q = next(iter(lane.items()))
                if max_tokens is not None and batch and work + q[0].encoded.tokens > max_tokens:
                    return True  # another client's item waits for the next batch, not behind this one's work
                item = q.popleft()
                self._size -= 1
                if q:
                    lane.move_to_end(client)  # the next client's turn
                else:
                    del lane[client]
                if item.future.done():  # its caller is gone
                    self._on_dropped(1)
                else:
                    batch.append(item)
                    work += item.encoded.tokens
        return len(batch) >= max_size

    async def _fill_when_arrived(self, batch: list[Pending], max_size: int, max_tokens: int | None) -> bool:
        while not len(self):
            self._arrived.clear()
            await self._arrived.wait()
        return self._fill(batch, max_size, max_tokens)

    async def next_batch(
        self,
        max_size: int,
        wait_s: float,
        on_cancel: Callable[[list[Pending]], None],
        max_tokens: int | None = None,
    ) -> list[Pending]:
        """The first live items, then, with ``wait_s`` > 0, what arrives until the batch holds ``max_size``
        items (or ``max_tokens`` of work: one inference call's budget, so that a batch never holds the core
        for a whole large request while another client's item waits) or ``wait_s`` after its first item
        arrived. Cancelled while waiting for company: ``on_cancel(items taken)`` (their callers must not
        wait for ever), then raises."""
        batch: list[Pending] = []
        full = False
        while not batch:
            full = await self._fill_when_arrived(batch, max_size, max_tokens)
        if full or wait_s <= 0:
            return batch
        try:
            async with asyncio.timeout_at(batch[0].enqueued + wait_s):
                while not full:
                    full = await self._fill_when_arrived(batch, max_size, max_tokens)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            on_cancel(batch)
            raise
        return batch
