"""Dynamic batching: requests that arrive together share one model call, behind a bounded queue."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Hashable, Sequence

from attn_jax.serve._metrics import Metrics

__all__ = ["BatchResult", "Batcher", "QueueFull", "ShuttingDown"]


class QueueFull(RuntimeError):
    """The queue holds too many sentences to take a request now (the server answers 503)."""


class ShuttingDown(RuntimeError):
    """The batcher has stopped taking requests (the server answers 503)."""


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """What a translate function returns for one batch: a translation per sentence, and which stopped at the
    length limit instead of ending with ``</s>``."""

    translations: list[str]
    stopped_at_limit: list[bool]


# translate(sentences, key) -> BatchResult; one key's options apply to the whole batch.
TranslateFn = Callable[[list[str], Hashable], BatchResult]


@dataclasses.dataclass
class _Item:
    sentences: Sequence[str]
    key: Hashable
    future: asyncio.Future
    arrived: float


class Batcher:
    """Collect requests into batches for one translate function, run one batch at a time in a worker thread.

    A batch starts with the oldest waiting request. It takes the waiting requests with the same options, in
    order, up to ``max_batch`` sentences. It waits at most ``max_wait_s`` after its first request arrived for
    more, and no longer once it is full. A request with more than ``max_batch`` sentences goes alone.
    At most ``max_queue`` sentences wait; :meth:`submit` refuses more with :class:`QueueFull`.

    Args:
      translate: the model call; it runs in one worker thread, never two batches at once.
      max_batch: sentences per model call.
      max_wait_s: how long a batch waits for more requests.
      max_queue: sentences that may wait for a model call.
      metrics: where batch sizes are counted.
    """

    def __init__(
        self,
        translate: TranslateFn,
        *,
        max_batch: int = 32,
        max_wait_s: float = 0.005,
        max_queue: int = 256,
        metrics: Metrics | None = None,
    ) -> None:
        if max_batch < 1 or max_queue < 1 or max_wait_s < 0:
            raise ValueError(
                f"max_batch and max_queue must be >= 1 and max_wait_s >= 0, got {max_batch}, {max_queue}, "
                f"{max_wait_s}"
            )
        self.translate = translate
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self.waiting = 0  # sentences queued, not yet in a batch
        self.running = 0  # sentences in the batch being translated
        self._queue: collections.deque[_Item] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def closing(self) -> bool:
        """Whether :meth:`stop` was called (new requests are refused)."""
        return self._closing

    async def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._wake = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="attn-jax-serve")
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Refuse new requests, translate those already queued, then end the loop."""
        self._closing = True
        if self._task is not None:
            self._wake.set()
            await self._task
            self._task = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def submit(self, sentences: Sequence[str], key: Hashable = None) -> list[tuple[str, bool]]:
        """Queue ``sentences`` and wait for ``(translation, stopped_at_limit)`` of each.

        Raises:
          QueueFull: taking them would make more than ``max_queue`` sentences wait.
          ShuttingDown: :meth:`stop` was called, or :meth:`start` never was.
          Exception: whatever the translate function raised for their batch.
        """
        if self._closing or self._task is None:
            raise ShuttingDown("the server is shutting down")
        if self.waiting + len(sentences) > self.max_queue:
            raise QueueFull(
                f"the queue is full ({self.waiting} sentences waiting, at most {self.max_queue}): retry later"
            )
        if not sentences:
            return []
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Item(list(sentences), key, future, time.monotonic()))
        self.waiting += len(sentences)
        self._wake.set()
        return await future

    def _ready(self) -> bool:
        """Whether the oldest request's batch should go now: full, waited long enough, or shutting down."""
        first = self._queue[0]
        size = sum(len(it.sentences) for it in self._queue if it.key == first.key)
        waited = time.monotonic() - first.arrived
        return self._closing or size >= self.max_batch or waited >= self.max_wait_s

    def _take(self) -> list[_Item]:
        """Remove and return the next batch's requests: the oldest, then those with its key that still fit."""
        first = self._queue.popleft()
        batch, size, keep = [first], len(first.sentences), collections.deque()
        while self._queue:
            item = self._queue.popleft()
            if item.key == first.key and size + len(item.sentences) <= self.max_batch:
                batch.append(item)
                size += len(item.sentences)
            else:
                keep.append(item)
        self._queue = keep
        self.waiting -= size
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self._ready():
                self._wake.clear()
                left = self.max_wait_s - (time.monotonic() - self._queue[0].arrived)
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=max(left, 0.0))
                except TimeoutError:
                    pass
                continue
            batch = self._take()
            lines = [s for it in batch for s in it.sentences]
            self.running = len(lines)
            try:
                result = await loop.run_in_executor(self._executor, self.translate, lines, batch[0].key)
                if len(result.translations) != len(lines):
                    raise RuntimeError(
                        f"the translate function returned {len(result.translations)} translations "
                        f"for {len(lines)} sentences"
                    )
            except Exception as e:  # noqa: BLE001 - the batch's requests get the error, the loop goes on
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(e)
                continue
            finally:
                self.running = 0
            self.metrics.batch(len(lines), sum(result.stopped_at_limit))
            start = 0
            for it in batch:
                end = start + len(it.sentences)
                pairs = list(
                    zip(result.translations[start:end], result.stopped_at_limit[start:end], strict=True)
                )
                if not it.future.done():
                    it.future.set_result(pairs)
                start = end
