"""Cold reads from S3 through nvfs vs plain boto3, lazy safetensors reads, and the daemon's memory bound.

Everything runs against one local SeaweedFS S3 server that this script starts
(``nvfs/testing/seaweed.py``), in one run, and ends in one table plus an acceptance section:

1. **Cold sequential read of a >= 2 GiB checkpoint.** A seeded mixed-precision training state
   (bf16 weights, fp32 master weights, AdamW moments: :mod:`benchmarks.harness.checkpoint`) is
   ``torch.save``d *through* an nvfs S3 mount. nvfs is unmounted and mounted again (its chunk
   cache is empty) and the kernel's caches are dropped (``echo 3 > /proc/sys/vm/drop_caches``,
   which also drops SeaweedFS's volume files) before each cold read:

   a. ``cat FILE > /dev/null`` through the mount, ``--trials`` times (3), each time on a fresh
      mount and followed by (c)'s ``get_object``, so that both see the same drift of a shared
      host; each row shows the median trial and lists them all;
   b. ``torch.load(FILE)`` through the mount in a new process, as a restoring job would (then
      loaded again, untimed, and checked tensor by tensor against the state);
   c. plain boto3 on the same uncompressed bytes, uploaded as one ordinary object to the same
      server: ``get_object`` streamed to nowhere (one connection), ``download_file`` with boto3's
      default ``TransferConfig`` to a local file (ranged GETs on 10 threads; the file is not
      fsynced) and ``download_fileobj`` with the default config into a sink that drops the bytes;
   d. ``cat FILE`` again, every chunk from a warm ``-o cache_dir`` (page cache dropped): the
      daemon's own read path, without SeaweedFS competing for the CPUs (no acceptance target);
   e. ``torch.load`` of a local copy that is in the page cache, in a new process: the loader's
      own speed, the most any filesystem could give it (no acceptance target; shown next to
      torch.load's check);
   f. the restore without nvfs, in a new process: ``get_object`` streamed into memory, then
      ``torch.load`` of it. ``torch.load`` through the mount is judged against this, the plain
      download that ends in tensors; ``cat`` against the best download of (c).

   nvfs's speed is given as a multiple of the best plain download. The file read through the
   mount is also hashed (untimed) and compared with the bytes that were uploaded.

2. **``safe_open`` of one tensor** of a 1 GiB safetensors file (64 tensors of 16 MiB, bf16 and
   fp32, written through the mount with ``save_file``) after a remount and a cache drop: how many
   bytes nvfs fetched from S3 for it, against the file's stored size (``user.nvfs.stored_size``).
   Measured outside nvfs: the measuring mount's ``endpoint_url`` is a TCP relay in this script
   that counts every byte SeaweedFS sends the daemon (response headers, listings and manifests
   included: an upper bound) and notes every request's method and path; the chunk GETs are
   priced with the stored sizes from the file's manifest. Counting stops once no traffic has
   passed for 1 s, so read-ahead the access started is included. (The daemon log cannot be used:
   nvfs keeps boto3/urllib3 quiet even at ``log_level=debug``; nor can ``rchar`` in
   ``/proc/PID/io``, which does not count Python's recv(2) calls.) Also shown: the least nvfs
   could have fetched, the stored size of the chunks the header and that tensor overlap.
   ``get_tensor`` maps the file lazily, so the timed part includes a ``clone()`` that touches
   every page of the tensor.

3. **Peak daemon RSS** while writing ``--rss-mib`` (8 GiB) through a fresh mount in 4 MiB
   ``write`` calls of semi-compressible data (normal floats rounded to bf16 precision, every 4 MiB
   block distinct so nothing dedups), then reading it back with ``cat``. VmRSS is sampled every
   0.2 s from ``/proc/PID/status`` in a thread, VmHWM is read at the end, each summed over the
   daemon and its fetch processes (``-o fetch_procs``: a chunk is in one process's memory at a
   time, the child's while it decodes, the daemon's once cached); the bound is
   ``cache_size + max_inflight + 256 MiB`` of the options the mounts use.

``--compare OPTIONS`` (repeatable) replaces part 1 with a comparison of mount options: the
checkpoint is saved as above, then each round runs a cold ``cat`` with the mount options and
with each variant's extra options, in turn, each followed by a cold ``get_object``; a row per
variant gives its median and the ratios to the ``get_object`` right after each cat.

Parts: :mod:`.restore` (1), :mod:`.lazy_open` (2), :mod:`.memory` (3); the table in :mod:`.table`.

Run as root (FUSE, drop_caches), from the repository root::

    python3 -m benchmarks.s3_read --quick      # smoke run, small sizes
    python3 -m benchmarks.s3_read              # 2 GiB checkpoint, 1 GiB safetensors, 8 GiB RSS run
    python3 -m benchmarks.s3_read --parts 1 --compare readahead=128M,threads=32   # options side by side
"""
