"""Bring your own model: a tiny attention translator that attn-jax trains, decodes and evaluates.

    .venv/bin/python examples/own_model.py                  # ~2 min on 2 cores: train, translate, evaluate
    .venv/bin/python examples/own_model.py --steps 50 --out /tmp/own   # a shorter run elsewhere

attn-jax's trainer, beam search and evaluation see a model only through the decoding-step interface
(:class:`attn_jax.models.Seq2SeqModel`): ``encode``, ``init_decoder_state``, ``decode_step`` and the teacher-forced
``__call__``. Any Flax NNX module with those four methods can be trained with :func:`attn_jax.train.train_and_evaluate`,
decoded with :func:`attn_jax.decoding.beam_search` and evaluated with :func:`attn_jax.pipeline.evaluate_workdir`.
Its config is a frozen dataclass with ``src_vocab`` and ``tgt_vocab`` fields and a ``build(*, rngs)`` method that
returns the module; a run names it as ``model.arch = "module:Class"`` (``module`` importable: installed, on
``PYTHONPATH``, or beside the script that trains it), and the class's other fields are the ``model.*`` keys, with
the class's defaults.

The model here is deliberately not one of the library's: a position-aware bag-of-embeddings encoder (no recurrence),
and a GRU decoder whose query attends the source by scaled dot product (:func:`attn_jax.dot_product_attention`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from attn_jax.attention import dot_product_attention, sinusoidal_positions
from attn_jax.models import EncoderOutput
from attn_jax.typing import Array, Bool, Float, Int


class TinyState(NamedTuple):
    """The decoder's state between steps: ``hidden [B, H]`` (batch-leading, so beam search can tile it)."""

    hidden: Float[Array, "B H"]


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    """The model's config: vocabulary sizes (filled in by the trainer) and widths (the ``model.*`` keys).

    The comment above each field is its help in ``attn-jax train --help-config``.
    """

    src_vocab: int
    tgt_vocab: int
    # Word-embedding width.
    embed: int = 32
    # Width of the decoder's GRU state.
    hidden: int = 64

    def build(self, *, rngs: nnx.Rngs) -> TinyTranslator:
        return TinyTranslator(self, rngs=rngs)


class TinyTranslator(nnx.Module):
    """Bag-of-embeddings encoder with sinusoidal positions; GRU decoder with scaled dot-product attention."""

    def __init__(self, config: TinyConfig, *, rngs: nnx.Rngs):
        e, h = config.embed, config.hidden
        self.src_embed = nnx.Embed(config.src_vocab, e, rngs=rngs)
        self.tgt_embed = nnx.Embed(config.tgt_vocab, e, rngs=rngs)
        self.encoder = nnx.Linear(e, h, rngs=rngs)
        self.decoder = nnx.GRUCell(e + h, h, rngs=rngs)
        self.output = nnx.Linear(2 * h, config.tgt_vocab, rngs=rngs)

    def encode(self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"]) -> EncoderOutput:
        x = self.src_embed(src) + sinusoidal_positions(src.shape[1], self.src_embed.features)  # [B, S, E]
        memory = jnp.tanh(self.encoder(x)) * src_mask[..., None]  # [B, S, H], zero at padding
        summary = memory.sum(1) / jnp.maximum(src_mask.sum(1, keepdims=True), 1)  # mean over real words
        return EncoderOutput(memory=memory, keys=memory, mask=src_mask, summary=summary)

    def init_decoder_state(self, enc: EncoderOutput) -> TinyState:
        return TinyState(hidden=enc.summary)

    def decode_step(
        self, enc: EncoderOutput, state: TinyState, prev_tokens: Int[Array, " B"]
    ) -> tuple[Float[Array, "B V"], TinyState, Float[Array, "B S"]]:
        context, weights = dot_product_attention(
            state.hidden[:, None, :], enc.keys, enc.memory, enc.mask[:, None, :], return_weights=True
        )  # [B, 1, H], [B, 1, S]
        context, weights = context[:, 0], weights[:, 0]
        hidden, _ = self.decoder(state.hidden, jnp.concatenate([self.tgt_embed(prev_tokens), context], -1))
        logits = self.output(jnp.concatenate([hidden, context], -1)).astype(jnp.float32)
        return logits, TinyState(hidden=hidden), weights

    def __call__(
        self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"], tgt_in: Int[Array, "B T"]
    ) -> tuple[Float[Array, "B T V"], Float[Array, "B T S"]]:
        enc = self.encode(src, src_mask)

        def body(state, prev):
            logits, state, weights = self.decode_step(enc, state, prev)
            return state, (logits, weights)

        _, (logits, weights) = jax.lax.scan(body, self.init_decoder_state(enc), tgt_in.T)  # time-major
        return jnp.moveaxis(logits, 0, 1), jnp.moveaxis(weights, 0, 1)


def run_config(steps: int):
    """A run of :class:`TinyConfig` on the built-in corpus (``attn_jax.train.default_config`` otherwise)."""
    from attn_jax.train import default_config

    config = default_config(arch=f"{__name__ if __name__ != '__main__' else 'own_model'}:TinyConfig")
    config.num_train_steps = steps
    config.eval_every = steps
    config.checkpoint_every = steps
    config.optimizer.update(name="adam", learning_rate=3e-3, eps=1e-8, clip_norm=1.0, warmup_steps=50)
    config.data.update(synthetic="tiny", batch_size=32, max_source_length=30, max_target_length=30)
    config.data.bucket_boundaries = (16, 24, 32)
    return config


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600, help="training steps (default: %(default)s)")
    p.add_argument("--out", default="runs/own_model", help="run directory (default: %(default)s)")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # so the run can import "own_model"

    from attn_jax.pipeline import DecodeOptions, evaluate_workdir, load_model, translate_sentences
    from attn_jax.train import train_and_evaluate

    train_and_evaluate(run_config(args.steps), args.out)
    loaded = load_model(args.out)
    ((best, *_),) = translate_sentences(
        loaded, ["the purple teapot threw the student across bracelets ."], DecodeOptions(beam_size=4)
    )
    print("translation:", best.text)
    result = evaluate_workdir(
        args.out, split="test", decode=DecodeOptions(beam_size=4), max_examples=100, log=print
    )
    print(f"test BLEU {result['bleu']:.2f}, AER {100 * result['aer']['aer']:.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
