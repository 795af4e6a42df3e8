"""Process limits shared by the bench scenarios (the gateway's own helper: a generator
process raises its open-file limit the same way a worker does)."""

from __future__ import annotations

from gateway.limits import raise_nofile

__all__ = ["raise_nofile"]
