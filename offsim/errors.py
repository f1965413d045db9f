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
        self.tier = tier
        self.need_bytes = float(need_bytes)
        self.capacity_bytes = float(capacity_bytes)
        self.detail = detail
        gib = 2**30
        msg = (
            f"{tier} memory: needs {self.need_bytes / gib:.2f} GiB but has "
            f"{self.capacity_bytes / gib:.2f} GiB"
        )
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class PolicyError(OffsimError):
    """A policy returned an illegal decision (names the policy and the op where it happened)."""
