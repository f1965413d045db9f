"""Re-export of :mod:`offsim.core.units` (where the unit constants live)."""

from offsim.core.units import GB, KB, MB, MS, TB, TFLOPS, US, GiB, KiB, MiB, TiB

__all__ = ["GB", "KB", "MB", "MS", "TB", "TFLOPS", "US", "GiB", "KiB", "MiB", "TiB"]
