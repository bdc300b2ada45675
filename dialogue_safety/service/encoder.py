"""Encoding off the event loop, coalesced: the submissions waiting for the encoding thread are
encoded together, one call per round instead of one per request (under load, each thread hand-off
costs a GIL switch interval while the event loop is busy). A large valid request never stalls
``/health`` or other clients: only a lone short request to an idle batcher is encoded on the loop.
Used by :class:`dialogue_safety.service.batcher.MicroBatcher`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.schema import Example

EncodeFn = Callable[[Sequence[Example]], list[EncodedExample]]
_Job = tuple[Sequence[Example], asyncio.Future[list[EncodedExample]]]


class EncodeCoalescer:
    """One encoding thread and the submissions waiting for it.

    ``stopped()`` is the error a submission gets when the coalescer stops before encoding it."""

    def __init__(self, encode: EncodeFn, stopped: Callable[[], BaseException]) -> None:
        self._encode = encode
        self._stopped = stopped
        self._waiting: list[_Job] = []
        self._busy = False
        self._task: asyncio.Task[None] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="safety-encode")

    def stop(self) -> None:
        """Fail the submissions not handed to the encoding thread yet; drop the thread's queued work."""
        self._fail(())
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def encode_inline(self, examples: Sequence[Example]) -> list[EncodedExample]:
        """``encode`` here and now."""
        return self._encode(examples)

    def _encode_in_thread(self, examples: Sequence[Example]) -> list[EncodedExample]:
        """``encode`` in the encoding thread, its error one a future can hold (:func:`future_safe`)."""
        try:
            return self._encode(examples)
        except BaseException as exc:
            safe = future_safe(exc, "encoding")
            if safe is exc:
                raise
            raise safe from exc

    async def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        """Encode in the encoding thread, together with whatever other submissions are waiting."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[EncodedExample]] = loop.create_future()
        self._waiting.append((examples, future))
        if not self._busy:
            self._busy = True
            self._task = loop.create_task(self._rounds())
        return await future

    async def _rounds(self) -> None:
        loop = asyncio.get_running_loop()
        jobs: list[_Job] = []
        try:
            while self._waiting:
                jobs, self._waiting = self._waiting, []
                jobs = [(examples, future) for examples, future in jobs if not future.done()]  # callers gone
                if not jobs:
                    continue
                flat = [example for examples, _ in jobs for example in examples]
                try:
                    encoded = await loop.run_in_executor(self._pool, self._encode_in_thread, flat)
                except Exception:
                    if len(jobs) == 1:
                        _fail(jobs[0][1], sys.exc_info()[1])
                        continue
                    for examples, future in jobs:  # isolate the submission that fails
                        try:
                            one = await loop.run_in_executor(self._pool, self._encode_in_thread, examples)
                        except Exception as exc:
                            _fail(future, exc)
                        else:
                            if not future.done():
                                future.set_result(one)
                    continue
                start = 0
                for examples, future in jobs:
                    if not future.done():
                        future.set_result(encoded[start : start + len(examples)])
                    start += len(examples)
        except BaseException:  # stopped: the pool dropped its queued work; no submission may wait forever
            self._fail(jobs)
            raise
        finally:
            self._busy = False

    def _fail(self, jobs: Sequence[_Job]) -> None:
        """Fail the submissions of ``jobs`` and those still waiting for the encoding thread."""
        waiting, self._waiting = self._waiting, []
        for _, future in [*jobs, *waiting]:
            _fail(future, self._stopped())


def future_safe(exc: BaseException, what: str) -> BaseException:
    """``exc`` as an error a future may hold for its awaiting caller: asyncio cannot set StopIteration on a
    future (it would stay pending for ever), and a CancelledError would read as the caller's own cancellation
    (or as the service stopping); both become a RuntimeError naming ``what`` raised them."""
    if isinstance(exc, StopIteration | asyncio.CancelledError):
        return RuntimeError(f"{what} raised {type(exc).__name__}")
    return exc


def _fail(future: asyncio.Future[list[EncodedExample]], exc: BaseException | None) -> None:
    if not future.done():
        future.set_exception(exc if exc is not None else RuntimeError("encoding failed"))
