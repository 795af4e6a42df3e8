"""The bench's split of a process's CPU into user and kernel time (`Sampler.kernel_percent`,
reported as `gateway_kernel_percent`): measured on this process doing Python work, then
doing system calls."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from bench.common import Sampler


def _burn(seconds: float, step: Callable[[], object]) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        step()


def test_python_work_is_user_time_and_system_calls_are_kernel_time() -> None:
    sampler = Sampler()
    sampler.watch("me", lambda: [os.getpid()])

    def window(step: Callable[[], object]) -> tuple[float, float]:
        """The window holding the two samples around 0.5 s of `step`, and no other."""
        t0 = time.monotonic()
        sampler.sample(force=True)
        _burn(0.5, step)
        sampler.sample(force=True)
        return t0, time.monotonic()

    user_t0, user_t1 = window(lambda: sum(range(2_000)))
    zero = os.open("/dev/zero", os.O_RDONLY)
    try:
        sys_t0, sys_t1 = window(lambda: os.read(zero, 1 << 20))  # the kernel clears 1 MiB
    finally:
        os.close(zero)
    user_share = sampler.kernel_percent("me", user_t0, user_t1)
    sys_share = sampler.kernel_percent("me", sys_t0, sys_t1)
    assert user_share is not None and sys_share is not None
    assert user_share < 30, user_share
    assert sys_share > 50, sys_share
    assert sampler.kernel_percent("nobody", user_t0, sys_t1) is None
