"""Planning: pure functions from a RunConfig to layers, sizes and footprints (no SimPy)."""
