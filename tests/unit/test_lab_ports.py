"""The lab's listening ports are picked below the kernel's ephemeral range, which outgoing
connections draw from (a port picked there was once taken between the pick and the API
server's bind: ``bind: address already in use``)."""

from __future__ import annotations

import socket
from pathlib import Path

from rollout.lab import controlplane
from rollout.lab.controlplane import free_port


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = controlplane._ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert max(1024, low - 12000) <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_an_unreadable_range_reads_as_the_kernels_default(tmp_path: Path) -> None:
    assert controlplane._ephemeral_low(tmp_path / "missing") == 32768
    (tmp_path / "range").write_text("40000\t60999\n")
    assert controlplane._ephemeral_low(tmp_path / "range") == 40000
