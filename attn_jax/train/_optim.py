"""Optimisers from optax: the paper's Adadelta with gradient-norm clipping, and Adam with warm-up and decay.

Bahdanau et al. (2015, section 4.2 and appendix B.2): "we use a minibatch stochastic gradient descent (SGD)
algorithm together with Adadelta (Zeiler, 2012) ... (ε = 10⁻⁶ and ρ = 0.95) ... we normalized the L2-norm of
the gradient of the cost function each time to be at most a predefined threshold of 1". That is
``optax.chain(optax.clip_by_global_norm(1.0), optax.adadelta(1.0, rho=0.95, eps=1e-6))``, which
:func:`make_optimizer` builds from the default :class:`OptimizerConfig`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax.numpy as jnp
import optax

__all__ = ["DECAYS", "OPTIMIZERS", "OptimizerConfig", "ema_decay_at", "make_optimizer", "make_schedule"]

OPTIMIZERS: tuple[str, ...] = ("adadelta", "adam")
DECAYS: tuple[str, ...] = ("constant", "cosine", "linear", "rsqrt")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """An optimiser and its learning-rate schedule (frozen and hashable: a static argument of the jitted step).

    Attributes:
      name: ``"adadelta"`` (Zeiler 2012; the paper) or ``"adam"`` (Kingma & Ba 2015; ``adamw`` when
        ``weight_decay > 0``).
      learning_rate: peak learning rate (Adadelta: a multiplier of its own step size, 1.0 in the paper).
      rho: Adadelta's decay of the running averages (paper: 0.95).
      eps: Adadelta's / Adam's ``ε`` (paper's Adadelta: 1e-6; Adam usually 1e-8).
      b1: Adam's first-moment decay.
      b2: Adam's second-moment decay.
      clip_norm: clip the gradient's global L2 norm to this (paper: 1); 0 disables clipping.
      weight_decay: decoupled weight decay (``p ← p - lr·wd·p``, Loshchilov & Hutter 2019) on every parameter;
        0 disables it.
      warmup_steps: linear warm-up from 0 to ``learning_rate`` over this many steps.
      decay: after warm-up: ``constant``; ``cosine`` / ``linear`` to ``final_lr_fraction · learning_rate`` at
        ``decay_steps``; ``rsqrt``: ``learning_rate · sqrt(max(warmup_steps, 1) / step)`` (Vaswani et al. 2017).
      decay_steps: step at which a cosine or linear decay ends (counted from step 0, warm-up included).
      decay_start: step at which a cosine or linear decay begins; between the end of warm-up and this step the
        rate holds at ``learning_rate`` (warm-up, stable, decay: anneal only the last updates). 0: the decay
        begins when warm-up ends.
      final_lr_fraction: learning rate at the end of a cosine/linear decay, as a fraction of the peak.
      accumulate: micro-batches per update (gradient accumulation). The update's gradient is that of
        ``Σ loss / Σ tokens`` over all of them, as for one batch holding their rows. 1: one batch per update.
      ema_decay: decay ``β`` of an exponential moving average of the parameters, kept beside them
        (:func:`ema_decay_at`); 0 keeps none.
    """

    name: Literal["adadelta", "adam"] = "adadelta"
    learning_rate: float = 1.0
    rho: float = 0.95
    eps: float = 1e-6
    b1: float = 0.9
    b2: float = 0.999
    clip_norm: float = 1.0
    weight_decay: float = 0.0
    warmup_steps: int = 0
    decay: Literal["constant", "cosine", "linear", "rsqrt"] = "constant"
    decay_steps: int = 0
    decay_start: int = 0
    final_lr_fraction: float = 0.0
    accumulate: int = 1
    ema_decay: float = 0.0

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer.name must be one of {', '.join(OPTIMIZERS)}; got {self.name!r}")
        if self.decay not in DECAYS:
            raise ValueError(f"optimizer.decay must be one of {', '.join(DECAYS)}; got {self.decay!r}")
        for field in ("learning_rate", "eps"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"optimizer.{field} must be a positive number, got {value!r}")
        for field in ("rho", "b1", "b2"):
            value = getattr(self, field)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"optimizer.{field} must be in [0, 1), got {value!r}")
        for field in ("clip_norm", "weight_decay"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"optimizer.{field} must be >= 0 (0 disables it), got {value!r}")
        for field in ("warmup_steps", "decay_steps", "decay_start"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"optimizer.{field} must be an int >= 0, got {value!r}")
        if isinstance(self.accumulate, bool) or not isinstance(self.accumulate, int) or self.accumulate < 1:
            raise ValueError(f"optimizer.accumulate must be an int >= 1, got {self.accumulate!r}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"optimizer.ema_decay must be in [0, 1) (0 disables it), got {self.ema_decay!r}")
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise ValueError(f"optimizer.final_lr_fraction must be in [0, 1], got {self.final_lr_fraction!r}")
        if self.decay in ("cosine", "linear") and self.decay_steps <= max(
            self.warmup_steps, self.decay_start
        ):
            raise ValueError(
                f"optimizer.decay={self.decay!r} needs decay_steps > warmup_steps and > decay_start, "
                f"got decay_steps={self.decay_steps}, warmup_steps={self.warmup_steps}, "
                f"decay_start={self.decay_start}"
            )
        if self.decay_start and self.decay not in ("cosine", "linear"):
            raise ValueError(
                f"optimizer.decay_start={self.decay_start} only applies to a cosine or linear decay, "
                f"got optimizer.decay={self.decay!r}"
            )


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
    """The learning rate as a function of the update count (warm-up, then the chosen decay).

    >>> s = make_schedule(OptimizerConfig(name="adam", learning_rate=1e-3, warmup_steps=10, decay="rsqrt"))
    >>> [round(float(s(t)) * 1e3, 3) for t in (0, 5, 10, 40)]
    [0.0, 0.5, 1.0, 0.5]
    """
    lr, warm = config.learning_rate, config.warmup_steps
    hold = max(config.decay_start - warm, 0)  # updates at the peak rate between warm-up and the decay
    if config.decay == "constant":
        decay = optax.constant_schedule(lr)
    elif config.decay == "cosine":
        decay = optax.cosine_decay_schedule(
            lr, config.decay_steps - warm - hold, alpha=config.final_lr_fraction
        )
    elif config.decay == "linear":
        decay = optax.linear_schedule(lr, lr * config.final_lr_fraction, config.decay_steps - warm - hold)
    else:

        def decay(count):  # count is relative to the end of warm-up
            return lr * jnp.sqrt(max(warm, 1) / jnp.maximum(count + warm, max(warm, 1)))

    if hold:
        decay = optax.join_schedules([optax.constant_schedule(lr), decay], [hold])
    if warm == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), decay], [warm])


def ema_decay_at(ema_decay: float, step):
    """The decay applied by the ``step``-th update (1, 2, ...) to the moving average of the weights.

    ``β_t = min(β, (1 + t) / (10 + t))``, the warm-up of TensorFlow's ``ExponentialMovingAverage`` with
    ``num_updates``: early averages forget the random initialisation fast, later ones decay at ``β``. After
    update ``t``, ``ema_t = β_t · ema_{t-1} + (1 - β_t) · θ_t`` with ``ema_0 = θ_0``.

    >>> [round(float(ema_decay_at(0.999, t)), 4) for t in (1, 8, 10_000)]
    [0.1818, 0.5, 0.999]
    """
    return jnp.minimum(ema_decay, (1.0 + step) / (10.0 + step))


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """The optax transformation ``config`` describes: clipping, then the optimiser, then weight decay.

    With the defaults this is exactly the paper's
    ``optax.chain(optax.clip_by_global_norm(1.0), optax.adadelta(1.0, rho=0.95, eps=1e-6))``.

    >>> import jax.numpy as jnp
    >>> tx = make_optimizer(OptimizerConfig())
    >>> params = {"w": jnp.zeros(2)}
    >>> updates, _ = tx.update({"w": jnp.array([30.0, 40.0])}, tx.init(params), params)
    >>> bool(jnp.all(updates["w"] < 0))
    True
    """
    schedule = make_schedule(config)
    parts = []
    if config.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(config.clip_norm))
    if config.name == "adadelta":
        if config.weight_decay > 0:
            parts += [
                optax.scale_by_adadelta(rho=config.rho, eps=config.eps),
                optax.add_decayed_weights(config.weight_decay),
                optax.scale_by_learning_rate(schedule),
            ]
        else:
            parts.append(optax.adadelta(schedule, rho=config.rho, eps=config.eps))
    elif config.weight_decay > 0:
        parts.append(
            optax.adamw(
                schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay
            )
        )
    else:
        parts.append(optax.adam(schedule, b1=config.b1, b2=config.b2, eps=config.eps))
    return parts[0] if len(parts) == 1 else optax.chain(*parts)
