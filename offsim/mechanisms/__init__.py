"""Mechanisms: one file per way training state moves or is computed. Each emits its ops at the
sites of a system's order (:mod:`offsim.mechanisms.base`); a system composes them."""
