"""Unit constants. Data files name their units (``_gib``, ``_gb_per_s``, ``_us``); models convert
them once, through these constants, into SI inside the package (bytes, seconds, bytes/s, FLOP/s).

GB, TB and GB/s are decimal (1e9), GiB is binary (2**30), as in the vendor sheets and in
../shared/reference/hardware_facts.md.
"""

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40

US = 1e-6
MS = 1e-3

TFLOPS = 1e12
