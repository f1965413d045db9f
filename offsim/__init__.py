"""offsim: a discrete-event simulator of offloaded LLM training."""

__version__ = "0.1.0"
