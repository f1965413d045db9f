"""Exceptions raised by offsim. Every user-facing error is an :class:`OffsimError`, so the CLI can
print its message alone (no traceback) and exit non-zero."""


class OffsimError(Exception):
    """Base class of every error offsim reports to a user."""


class ConfigError(OffsimError):
    """A profile, workload, strategy or other input file is malformed or inconsistent.

    The message names the file, the field and what was expected.
    """


class InfeasibleError(OffsimError):
    """A configuration does not fit: a memory tier would exceed its capacity.

    Attributes:
        tier: the memory tier that overflows (``gpu``, ``host_pinned``, ``host``, ``nvme``).
        need_bytes: bytes the configuration needs on that tier.
        capacity_bytes: bytes the tier has.
    """

    def __init__(self, tier: str, need_bytes: float, capacity_bytes: float, detail: str = "") -> None:
        # the positional args are kept so that the error can be re-created from ``args``
        # (SimPy does this when a process fails)
        super().__init__(tier, need_bytes, capacity_bytes, detail)
        self.tier = tier
        self.need_bytes = float(need_bytes)
        self.capacity_bytes = float(capacity_bytes)
        self.detail = detail

    def __str__(self) -> str:
        gib = 2**30
        msg = (
            f"{self.tier} memory: needs {self.need_bytes / gib:.2f} GiB but has "
            f"{self.capacity_bytes / gib:.2f} GiB"
        )
        return f"{msg} ({self.detail})" if self.detail else msg


class PolicyError(OffsimError):
    """A policy returned an illegal decision; the message names the policy and the op."""


class ScheduleError(OffsimError):
    """A schedule is malformed: an op waits on itself or on a later op, a free exceeds what was
    allocated, a pool is released more than it was acquired. A bug in a system or mechanism, not in
    the user's input; the message names the op."""
