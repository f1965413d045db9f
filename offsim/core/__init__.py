"""What everything else stands on: enums for closed sets, units, errors, the version.

Nothing here imports from the rest of offsim.
"""
