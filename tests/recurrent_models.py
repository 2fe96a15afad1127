"""What the recurrent models' tests share (test_models_rnn.py, test_gnmt.py): sizes, a batch, redrawn parameters
and one compiled model.

Sizes are odd and distinct (B=3, S=7, T=5, K_x=17, K_y=19) so a swapped axis cannot pass.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_jax.attention._softmax import assert_valid_attention_weights

B, S, T = 3, 7, 5
LENGTHS = (7, 4, 1)  # a full, a padded and a one-word sentence
KX, KY = 17, 19


def rel_err(a, b):
    """``max|a - b| / max|b|``: the error relative to the reference's scale."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def redrawn(build, seed=0, scale=0.5):
    """The model ``build()`` makes, every parameter redrawn from N(0, scale²) with NumPy.

    Built with ``nnx.eval_shape`` (the constructor runs abstractly) and filled from NumPy: eager initialisation
    compiles one XLA program per random op and shape, which costs seconds each on the shared CPU.
    """
    graphdef, state = nnx.split(nnx.eval_shape(build))
    rng = np.random.default_rng(seed)
    state = jax.tree.map(lambda x: jnp.asarray(scale * rng.normal(size=x.shape), x.dtype), state)
    return nnx.merge(graphdef, state)


def make_batch(seed=0, lengths=LENGTHS, t=T):
    """``(src [B, S], src_mask [B, S], tgt_in [B, t])`` with random words, padded to ``S``."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, KX, (len(lengths), S)).astype(np.int32)
    mask = np.arange(S)[None, :] < np.asarray(lengths)[:, None]
    src = np.where(mask, src, 0)  # pad id 0, also used by real words: only the mask says what is padding
    tgt_in = rng.integers(0, KY, (len(lengths), t)).astype(np.int32)
    return jnp.asarray(src), jnp.asarray(mask), jnp.asarray(tgt_in)


def random_params(rng, shapes, context=True):
    """A cell's parameters drawn from N(0, 0.5²), ``shapes`` by name; ``context=False`` leaves out ``w_c``."""
    return {
        k: jnp.asarray(rng.normal(0, 0.5, v), jnp.float32) for k, v in shapes.items() if context or k != "w_c"
    }


def pure_params(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


class Compiled:
    """One model with jitted teacher-forced forward, encode+init and decode step (compiled once, shared by tests)."""

    def __init__(self, model):
        self.model = model
        graphdef, self.state = nnx.split(model)
        self._forward = jax.jit(lambda st, *a: nnx.merge(graphdef, st)(*a))

        def start(st, src, mask):
            m = nnx.merge(graphdef, st)
            enc = m.encode(src, mask)
            return enc, m.init_decoder_state(enc)

        self._start = jax.jit(start)
        self._step = jax.jit(lambda st, e, d, y: nnx.merge(graphdef, st).decode_step(e, d, y))

    def forward(self, src, mask, tgt_in):
        return self._forward(self.state, src, mask, tgt_in)

    def start(self, src, mask):
        return self._start(self.state, src, mask)

    def step(self, enc, dec, prev):
        return self._step(self.state, enc, dec, prev)

    def step_loop(self, src, mask, tgt_in):
        """Decode position by position (a Python loop on purpose: the reference the scans must equal)."""
        enc, dec = self.start(src, mask)
        logits, attn = [], []
        for i in range(tgt_in.shape[1]):
            lo, dec, a = self.step(enc, dec, tgt_in[:, i])
            logits.append(lo)
            attn.append(a)
        return jnp.stack(logits, 1), None if attn[0] is None else jnp.stack(attn, 1)


def forward_once(model):
    """``(compiled model, batch, teacher-forced logits, attention)`` of ``model`` on ``make_batch()``."""
    compiled = Compiled(model)
    batch = make_batch()
    logits, attn = compiled.forward(*batch)
    return compiled, batch, logits, attn


def assert_bf16_close(fp32, bf16):
    """A bfloat16-compute model (``bf16``, compiled) against its float32 twin's ``forward_once`` output ``fp32``.

    bf16 keeps 8 mantissa bits (relative rounding 2^-9 ≈ 2e-3 per operand); matmul operands are rounded in every
    layer at every step while states and logits stay float32, so a few percent of the scale is expected.
    """
    _, (src, mask, tgt_in), logits32, attn32 = fp32
    logits16, attn16 = bf16.forward(src, mask, tgt_in)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(bf16.state))
    assert jax.eval_shape(bf16.model.encode, src, mask).memory.dtype == jnp.bfloat16
    assert logits16.dtype == jnp.float32 and attn16.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(logits16)))
    assert_valid_attention_weights(attn16, mask[:, None, :])
    assert rel_err(logits16, logits32) < 5e-2
    np.testing.assert_allclose(attn16, attn32, atol=5e-2)
    assert rel_err(logits16, logits32) > 1e-5  # it did compute in bf16
