"""Early stopping: stop a run after ``patience`` validations without improvement of its best metric.

A validation improves when its metric beats the best value so far by more than ``min_delta`` (lower NLL, higher
BLEU or chrF); only then does the best value move (the rule of Keras's ``EarlyStopping``). The state is three
numbers, saved in every checkpoint beside the iterator position, so a resumed run keeps counting where the
interrupted one was.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from attn_jax.train._config import BEST_METRICS

__all__ = ["EarlyStopping", "early_stopping_update"]


class EarlyStopping(NamedTuple):
    """Where early stopping stands after the validations so far.

    Attributes:
      metric: the ``checkpoint.best_metric`` it follows (``nll``, ``bleu`` or ``chrf``).
      best: the best value so far (in the metric's own units), or None before the first validation.
      best_step: the step of that value.
      bad: validations since the last improvement.
    """

    metric: str
    best: float | None = None
    best_step: int | None = None
    bad: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, as checkpoints store it."""
        return self._asdict()

    @classmethod
    def from_json(cls, saved: Any, metric: str) -> EarlyStopping | None:
        """The state saved for ``metric``; None when nothing was saved or it followed another metric."""
        if not isinstance(saved, dict) or saved.get("metric") != metric:
            return None
        best = saved.get("best")
        return cls(metric, None if best is None else float(best), saved.get("best_step"), int(saved["bad"]))


def early_stopping_update(
    state: EarlyStopping, value: float, step: int, *, min_delta: float = 0.0
) -> EarlyStopping:
    """The state after a validation at ``step`` whose metric is ``value``.

    >>> s = EarlyStopping("bleu")
    >>> for step, bleu in ((10, 5.0), (20, 9.0), (30, 9.05), (40, 8.0)):
    ...     s = early_stopping_update(s, bleu, step, min_delta=0.1)
    >>> s.best, s.best_step, s.bad
    (9.0, 20, 2)
    """
    higher = BEST_METRICS[state.metric][1]
    if state.best is None:
        better = True
    elif higher:
        better = value > state.best + min_delta
    else:
        better = value < state.best - min_delta
    if better:
        return EarlyStopping(state.metric, float(value), int(step), 0)
    return state._replace(bad=state.bad + 1)
