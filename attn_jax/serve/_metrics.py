"""The counts ``GET /metrics`` reports: requests by status, refusals by reason, batch sizes and latency."""

from __future__ import annotations

import bisect
import collections
import threading
from typing import Any

__all__ = ["LATENCY_BUCKETS_S", "Metrics"]

# Upper bounds (seconds) of the latency histogram; the last bucket holds everything slower.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_RECENT = 10_000  # latencies kept for the percentiles


def _percentile(sorted_values: list[float], q: float) -> float | None:
    """The nearest-rank percentile ``q`` in [0, 100]; None when there are no values."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


class Metrics:
    """Thread-safe counters of one server process. Every refusal is counted under its reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: collections.Counter[int] = collections.Counter()  # by HTTP status
        self.refused: collections.Counter[str] = collections.Counter()  # by reason
        self.sentences = 0  # sentences translated (blank ones included)
        self.stopped_at_limit = 0  # translations cut at their length limit
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # sentences per model call
        self.latency_counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self._recent: collections.deque[float] = collections.deque(maxlen=_RECENT)

    def answered(self, status: int, seconds: float, reason: str | None = None) -> None:
        """Count one answered request; a refusal (any status but 200) also under its ``reason``."""
        with self._lock:
            self.requests[status] += 1
            if status != 200:
                self.refused[reason or f"http_{status}"] += 1
            self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
            self._recent.append(seconds)

    def batch(self, sentences: int, stopped_at_limit: int) -> None:
        """Count one call of the model on ``sentences`` sentences."""
        with self._lock:
            self.batch_sizes[sentences] += 1
            self.sentences += sentences
            self.stopped_at_limit += stopped_at_limit

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        """The counts as a JSON-ready dict, with ``extra`` fields (the queue's depth) added."""
        with self._lock:
            recent = sorted(self._recent)
            bounds = [*(str(b) for b in LATENCY_BUCKETS_S), "inf"]
            return {
                "requests": sum(self.requests.values()),
                "requests_by_status": {str(k): v for k, v in sorted(self.requests.items())},
                "refused": sum(self.refused.values()),
                "refused_by_reason": dict(sorted(self.refused.items())),
                "sentences": self.sentences,
                "stopped_at_limit": self.stopped_at_limit,
                "batches": sum(self.batch_sizes.values()),
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "latency_s": {
                    "le": dict(zip(bounds, self.latency_counts, strict=True)),
                    "p50": _percentile(recent, 50),
                    "p99": _percentile(recent, 99),
                    "window": len(recent),
                },
                **extra,
            }
