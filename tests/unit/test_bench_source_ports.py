"""The storm and connect generators bind source ports outside the kernel's ephemeral
range, so that the gateway's own connections to Redis and MySQL still find one."""

from __future__ import annotations

from pathlib import Path

from bench.holders import source_ports


def test_generator_ports_leave_the_ephemeral_range_to_the_kernel(tmp_path: Path) -> None:
    proc = tmp_path / "ip_local_port_range"
    proc.write_text("32768\t60999\n")
    ports = source_ports(str(proc))
    assert ports[0] == 1024 and ports[-1] == 65535
    assert 32767 in ports and 61000 in ports
    assert not any(32768 <= p <= 60999 for p in ports)
    assert len(ports) == 65536 - 1024 - (60999 - 32768 + 1)


def test_the_machines_own_range_is_read(tmp_path: Path) -> None:
    proc = tmp_path / "ip_local_port_range"
    proc.write_text("10000 20000\n")
    assert 15000 not in source_ports(str(proc)) and 30000 in source_ports(str(proc))
