"""The one C extension: nvfs.codec._planes, the byte-plane loops (optional: numpy does the same)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("nvfs.codec._planes", ["nvfs/codec/_planes.c"], optional=True,
                             extra_compile_args=["-O3"])])
