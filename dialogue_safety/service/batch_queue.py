"""The micro-batcher's queue: pending items (an encoded example, the future its caller awaits and the
admission charge it holds) in two lanes, and how a batch of **rows** is formed from them.

An item is scored in rows (:attr:`dialogue_safety.core.encoding.EncodedExample.model_rows`: each window
of a long utterance, each window of its utterance-alone row), and a batch is rows, not items: a long
item's rows are spread over successive batches, with other clients' rows between them, and it is
answered once its last row is scored. A batch closes at ``max_size`` rows or when the next row would take
its tokens past ``max_tokens`` (one inference call's worth: no batch holds the core for longer than
that, whatever the size of the requests behind it).

Classification rows go first; explanation rows fill what room is left, so that a long explanation
never stands in front of a classification. Within a lane the clients take turns by work (start-time
fair queueing over model tokens): the next row is the one of the client whose turn tag is lowest; taking
a row moves its client's tag on by the row's tokens, and a client that starts waiting starts at the tag
of the row taken last. A client that sends one request at a time therefore goes before the next row of
a client that keeps the queue busy, and two busy clients get the same tokens. Within a client, its items
in the order they arrived. Used by :class:`dialogue_safety.service.batcher.MicroBatcher`; admission
(:mod:`dialogue_safety.service.admission`) bounds what it holds.

With several inference workers, a batch is formed for one worker while the others run theirs: the clients
whose rows are in flight elsewhere (``busy``) are passed over, so a client's long request holds one worker
while another client's rows run on the next. Only when nothing but busy clients' rows waits does a worker
take them (a **borrowed** batch, which the batcher stops and gives back with :meth:`BatchQueue.put_back`
as soon as another client's rows arrive and no worker is free).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.schema import Prediction
from dialogue_safety.service.admission import CLASSIFY, EXPLAIN, Charge, LaneName


@dataclass(slots=True, eq=False)
class Pending:
    """One item of a request: its rows are handed to batches in order (``todo``: the indices not yet handed
    out; a stopped batch's rows come back to its front), their logits (``logits``, [rows, heads]) written by
    the inference workers as they are scored (``scored`` of them so far: the item is answered at all)."""

    encoded: EncodedExample
    future: asyncio.Future[Prediction]
    enqueued: float  # loop.time() when the submission arrived (before encoding)
    charge: Charge | None = None  # its request's admission charge; this item's tokens go back when it settles
    lane: LaneName = CLASSIFY
    rows: tuple[EncodedExample, ...] = field(init=False)
    todo: deque[int] = field(init=False)
    scored: int = field(default=0, init=False)  # rows scored (by the inference workers, under their lock)
    logits: Any = field(default=None, init=False)  # np.ndarray once a row is scored (inference workers only)
    dropped: bool = field(default=False, init=False)  # its caller went away and its rows were dropped
    started: bool = field(default=False, init=False)  # a row of it was handed to a batch (its queue wait is known)

    def __post_init__(self) -> None:
        self.rows = self.encoded.model_rows
        self.todo = deque(range(len(self.rows)))

    @property
    def client(self) -> str:
        return self.charge.client if self.charge is not None else ""


@dataclass(frozen=True, slots=True)
class Row:
    """One row of a batch: row ``index`` of ``item``."""

    item: Pending
    index: int

    @property
    def encoded(self) -> EncodedExample:
        return self.item.rows[self.index]


class _Lane:
    """The items of one lane, a queue per client, and whose turn it is (the lowest tag; ties: who came first)."""

    def __init__(self) -> None:
        self.clients: dict[str, deque[Pending]] = {}
        self.tags: dict[str, int] = {}
        self.now = 0  # the tag of the row taken last
        self._turns: list[tuple[int, int, str]] = []  # (tag, arrival, client); stale entries skipped
        self._arrival = itertools.count()

    def put(self, item: Pending) -> None:
        client = item.client
        q = self.clients.get(client)
        if q is None:
            self.clients[client] = q = deque()
            self._push(client, self.now)  # a client that starts waiting starts at the current turn
        q.append(item)

    def _push(self, client: str, tag: int) -> None:
        self.tags[client] = tag
        heapq.heappush(self._turns, (tag, next(self._arrival), client))

    def next_client(self, busy: Collection[str] = ()) -> str | None:
        """The client whose row goes next, passing over those in ``busy`` (None: no other client waits)."""
        while self._turns:
            tag, _, client = self._turns[0]
            if self.tags.get(client) == tag and client in self.clients:
                break
            heapq.heappop(self._turns)  # stale: the client's tag moved on, or it has nothing left
        else:
            return None
        if client not in busy:
            return client
        passed: list[tuple[int, int, str]] = []  # the busy clients' entries, pushed back below
        found = None
        while self._turns:
            entry = heapq.heappop(self._turns)
            tag, _, waiting = entry
            if self.tags.get(waiting) != tag or waiting not in self.clients:
                continue  # stale: dropped on the way
            passed.append(entry)
            if waiting not in busy:
                found = waiting
                break
        for entry in passed:
            heapq.heappush(self._turns, entry)
        return found

    def take(self, client: str) -> tuple[Row, bool]:
        """The next row of ``client``'s first item, and whether that item is now fully taken."""
        q = self.clients[client]
        item = q[0]
        row = Row(item, item.todo.popleft())
        finished = not item.todo
        if finished:
            q.popleft()
        self.now = self.tags[client]
        if self._turns and self._turns[0][2] == client:
            heapq.heappop(self._turns)  # its turn, taken (when it was passed to, its entry is stale below)
        self.tags[client] = -1  # any entry of its left in the heap is stale now
        if q:
            self._push(client, self.now + len(row.encoded))
        else:
            self.forget(client)
        return row, finished

    def put_back(self, item: Pending, indices: list[int]) -> bool:
        """Give ``item``'s rows ``indices`` (handed out, not scored) back, first in its client's turn, and the
        turn they moved its client on (their tokens); True if the item was fully taken before (it waits again)."""
        q = self.clients.get(item.client)
        if q is None:
            self.clients[item.client] = q = deque()
            self._push(item.client, self.now)
        else:
            tokens = sum(len(item.rows[i]) for i in indices)
            self._push(item.client, max(self.now, self.tags[item.client] - tokens))
        again = not item.todo
        item.todo.extendleft(reversed(indices))
        if again:
            q.appendleft(item)
        return again

    def drop_first(self, client: str) -> Pending:
        """Remove ``client``'s first item (its caller is gone) without a turn passing."""
        q = self.clients[client]
        item = q.popleft()
        if not q:
            self.forget(client)
        return item

    def forget(self, client: str) -> None:
        del self.clients[client]
        del self.tags[client]

    def items(self) -> Iterator[Pending]:
        return (item for q in self.clients.values() for item in q)

    def clear(self) -> None:
        self.clients.clear()
        self.tags.clear()
        self._turns.clear()


class BatchQueue:
    """The pending items of both lanes. ``on_dropped(n)``: ``n`` items whose caller went away were dropped
    when reached. ``len()``: the items with rows not yet handed to a batch."""

    def __init__(self, on_dropped: Callable[[int], None]) -> None:
        self._lanes: dict[LaneName, _Lane] = {CLASSIFY: _Lane(), EXPLAIN: _Lane()}
        self._size = 0
        self._arrived = asyncio.Event()
        self._on_dropped = on_dropped

    def __len__(self) -> int:
        return self._size

    def _items(self) -> Iterator[Pending]:
        return (item for lane in self._lanes.values() for item in lane.items())

    def rows(self) -> int:
        """Rows waiting (not yet handed to a batch)."""
        return sum(len(item.todo) for item in self._items())

    def live(self) -> int:
        """Items waiting whose caller still waits (cancelled ones are dropped when reached)."""
        return sum(1 for item in self._items() if not item.future.done())

    def put(self, item: Pending) -> None:
        self._lanes[item.lane].put(item)
        self._size += 1
        self._arrived.set()

    def take_all(self) -> list[Pending]:
        """Empty the queue (stopping)."""
        items = list(self._items())
        for lane in self._lanes.values():
            lane.clear()
        self._size = 0
        return items

    def drop(self, items: Iterator[Pending] | list[Pending]) -> None:
        """Count the items whose caller went away (once each; a failed item is not counted)."""
        gone = 0
        for item in items:
            if item.future.cancelled() and not item.dropped:
                item.dropped = True
                gone += 1
        if gone:
            self._on_dropped(gone)

    def put_back(self, rows: Iterable[Row]) -> None:
        """Rows of a stopped batch, not scored: back to the front of their items (first in their clients'
        turn), the items whose caller is gone left out."""
        by_item: dict[int, tuple[Pending, list[int]]] = {}
        for row in rows:
            by_item.setdefault(id(row.item), (row.item, []))[1].append(row.index)
        gone = []
        for item, indices in reversed(by_item.values()):  # each to the front: the first ends up first
            if item.future.done():
                gone.append(item)  # its caller went away meanwhile: dropped (counted once)
            elif self._lanes[item.lane].put_back(item, sorted(indices)):
                self._size += 1
        self.drop(gone)
        if self._size:
            self._arrived.set()

    def _fill(self, batch: list[Row], max_size: int, max_tokens: int | None = None, busy: Collection[str] = ()) -> bool:
        """Move rows into ``batch`` (classification first; the clients of a lane by turn, passing over those in
        ``busy``) until it holds ``max_size`` rows or, with ``max_tokens``, the next row's tokens would take it
        past that (a first row always goes in); drop the items whose caller is gone. True when the batch is full."""
        work = sum(len(row.encoded) for row in batch)  # the batch's tokens so far (it may be refilled)
        for lane in self._lanes.values():
            while len(batch) < max_size and (client := lane.next_client(busy)) is not None:
                item = lane.clients[client][0]
                if item.future.done():  # its caller is gone (or an earlier row failed): the rest is not run
                    lane.drop_first(client)
                    self._size -= 1
                    self.drop([item])
                    continue
                tokens = len(item.rows[item.todo[0]])
                if max_tokens is not None and batch and work + tokens > max_tokens:
                    return True  # the next row waits for the next batch: no batch holds more than one call's work
                row, finished = lane.take(client)
                if finished:
                    self._size -= 1
                batch.append(row)
                work += tokens
        return len(batch) >= max_size

    async def _arrival(self) -> None:
        while not len(self):
            self._arrived.clear()
            await self._arrived.wait()

    async def next_batch(
        self,
        max_size: int,
        wait_s: float,
        on_cancel: Callable[[list[Row]], None],
        max_tokens: int | None = None,
        busy: Callable[[], Collection[str]] = frozenset,
        free: Callable[[], int] = lambda: 1,
    ) -> tuple[list[Row], bool]:
        """The next live rows of the clients not ``busy()`` (with rows in flight on another worker), then, with
        ``wait_s`` > 0, what arrives until the batch holds ``max_size`` rows (or ``max_tokens`` tokens: one
        inference call's budget) or ``wait_s`` after its first row's item arrived; and whether it is borrowed:
        when only busy clients' rows wait, a batch of theirs, at once. With ``free()`` workers free (this one
        included), the rows waiting are shared out: this batch takes its share of them, so a lone request's
        rows run on the free workers side by side. Cancelled while waiting for company: ``on_cancel(rows
        taken)`` (their callers must not wait for ever), then raises."""
        batch: list[Row] = []
        full = borrowed = False
        while not batch:
            await self._arrival()
            if (workers := free()) > 1:
                max_size = min(max_size, -(-self.rows() // workers))
            full = self._fill(batch, max_size, max_tokens, busy())
            if not batch and len(self):  # only busy clients' rows wait (or none is live any more)
                full = self._fill(batch, max_size, max_tokens)
                borrowed = True
        if borrowed or full or wait_s <= 0:
            return batch, borrowed
        try:
            async with asyncio.timeout_at(batch[0].item.enqueued + wait_s):
                while not full:  # nothing more to take now (or only busy clients' rows): wait for an arrival
                    self._arrived.clear()
                    await self._arrived.wait()
                    full = self._fill(batch, max_size, max_tokens, busy())
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            on_cancel(batch)
            raise
        return batch, borrowed
