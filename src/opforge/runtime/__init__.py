"""Shared machinery for every op family: devices, the variant registry, backend policy, tracing.

Nothing in this package knows about a particular op.
"""
