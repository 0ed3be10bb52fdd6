"""pytfm's benchmarks: `python -m bench` runs bench/run.py (see its docstring)."""
