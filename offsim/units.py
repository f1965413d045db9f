"""Re-export of :mod:`offsim.core.units` (where the unit constants live)."""

from offsim.core.units import GB, MB, MS, TB, TFLOPS, US, GiB, KiB, KB, MiB, TiB

__all__ = ["GB", "KB", "MB", "MS", "TB", "TFLOPS", "US", "GiB", "KiB", "MiB", "TiB"]
