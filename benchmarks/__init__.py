"""Benchmarks of nvfs, one module per scenario, run from the repository root.

``python3 -m benchmarks.<scenario> --help`` says what a scenario measures; README.md in this
folder lists them all. The shared machinery (mounts, the null filesystem, memory sampling, the
result files) is in :mod:`benchmarks.harness`.
"""
