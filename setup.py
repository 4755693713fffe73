"""nvfs's compiled loops, both optional (the package works without a compiler):

- nvfs.codec._planes (C): the byte-plane loops; numpy does the same, slower.
- nvfs.codec._huffman (C++): Huffman-only zstd frames for float planes, from the GPU engine's
  frame code (zstd_huffman.cu, built for the host); zstandard codes the planes without it.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("nvfs.codec._planes", ["nvfs/codec/_planes.c"], optional=True, extra_compile_args=["-O3"]),
    Extension("nvfs.codec._huffman", ["nvfs/codec/_huffman.cpp"], optional=True, language="c++",
              extra_compile_args=["-O3"], depends=["nvfs/codec/zstd_huffman.cu"]),
])
