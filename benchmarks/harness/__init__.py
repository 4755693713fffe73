"""What every benchmark scenario needs, so that each does it the same way.

``mounts``: nvfs and JuiceFS mounts and their clean-up; ``null_fs``: a pyfuse3 filesystem that
does no work, the ceiling of the Python FUSE path; ``rss``: a daemon's memory sampled over a
run; ``files``: page-cache control and file sums; ``system``: what the machine and the checkout
are; ``report``: tables' cells, acceptance lines and the JSON result file; ``cli``: the common
command-line options and a run's temp dir; ``checkpoint``: a seeded mixed-precision training
state to save. Only ``checkpoint`` imports torch.
"""
