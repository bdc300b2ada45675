"""What the micro-batcher reports (implemented by :class:`dialogue_safety.service.telemetry.ServiceMetrics`)."""

from __future__ import annotations

from typing import Protocol


class BatchObserver(Protocol):
    def observe_queue_depth(self, depth: int) -> None: ...
    def observe_queue_wait(self, seconds: float) -> None: ...
    def observe_tokenization(self, seconds: float) -> None: ...
    def observe_batch(self, size: int, padded_tokens: int, seconds: float) -> None: ...
    def observe_dropped(self, n: int) -> None: ...
    def observe_batch_failure(self) -> None: ...


class NullObserver:
    """Reports to nobody (a batcher built without metrics)."""

    def observe_queue_depth(self, depth: int) -> None:
        pass

    def observe_queue_wait(self, seconds: float) -> None:
        pass

    def observe_tokenization(self, seconds: float) -> None:
        pass

    def observe_batch(self, size: int, padded_tokens: int, seconds: float) -> None:
        pass

    def observe_dropped(self, n: int) -> None:
        pass

    def observe_batch_failure(self) -> None:
        pass
