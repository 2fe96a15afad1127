"""``python -m attn_jax.cli``: the ``attn-jax`` command (a multi-process ``train`` re-runs itself this way)."""

from attn_jax.cli import main

raise SystemExit(main())
