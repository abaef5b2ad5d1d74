"""What the tests ask of this machine's network: the addresses a port listens on."""

from __future__ import annotations

from pathlib import Path


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port``, from /proc/net/tcp{,6} (Linux)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                if len(address) == 8:
                    found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
                else:
                    found.add(address)
    return found
