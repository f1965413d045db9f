"""A strategy file's knobs, composed in the standard order (a user's file, or one imported from a
DeepSpeed, Accelerate or Megatron configuration, that names no system).
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
