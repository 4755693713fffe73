"""Helpers for the tests and the benchmarks, not used by the filesystem itself.

They live in the package, rather than under tests/ or benchmarks/, so that both of those can
import them without either importing the other: a local SeaweedFS S3 server
(:mod:`nvfs.testing.seaweed`) and readers of a process tree's /proc counters
(:mod:`nvfs.testing.procfs`).
"""
