"""The experiments' phase timer: phases add up, and JAX compiles are counted through jax.monitoring."""

import os
import re
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
from phases import PhaseTimer  # noqa: E402


def test_phases_sum_to_at_most_total_and_compiles_are_counted():
    timer = PhaseTimer().listen()
    with timer.phase("sleep"):
        time.sleep(0.05)
    with timer.phase("compile"):
        # Two distinct shapes: two backend compiles, then a cache hit that compiles nothing.
        def triple_plus_one(x):
            return x * 3 + 1

        f = jax.jit(triple_plus_one)
        f(np.ones(3, np.float32)).block_until_ready()
        f(np.ones(5, np.float32)).block_until_ready()
        f(np.ones(5, np.float32)).block_until_ready()
    timer.close()
    rows = timer.markdown()
    wall_total, _ = timer.total()

    assert rows[0] == "| phase | wall s | CPU s |"
    assert timer.wall["sleep"] >= 0.05
    assert sum(timer.wall.values()) <= wall_total
    assert timer.compiles == 2
    assert 0.0 < timer.compile_s <= timer.wall["compile"]
    assert re.search(r"^\| compile \(2 programs", "\n".join(rows), re.M)
    assert timer.by_name == {"jit(triple_plus_one)": 2}
    assert "Compiled more than once: `jit(triple_plus_one)` x2." in rows
    assert timer.seconds_by_name["jit(triple_plus_one)"] == timer.compile_s
    assert rows[-1].startswith("Most compile seconds: `jit(triple_plus_one)` ")
    assert any(r.startswith("| total | ") for r in rows)

    # After close the listener is gone: a fresh program is not counted.
    jax.jit(lambda x: x - 7)(np.ones(2, np.float32)).block_until_ready()
    assert timer.compiles == 2
