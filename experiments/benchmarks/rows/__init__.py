"""The benchmark's rows, one module each; ``bench.py`` runs them and writes RESULTS.md."""
