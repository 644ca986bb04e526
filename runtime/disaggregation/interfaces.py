"""Which network devices the KV transfer may use: never wider than the worker's own --host."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def ucx_devices(host: str, device: str | None) -> str | None:
    """UCX_NET_DEVICES for a worker on `host`: the device the user named, else `lo` for a
    loopback host, else the interface that holds `host`'s address; None (every device) only
    for a wildcard host (0.0.0.0 or ::), which asked for every interface."""
    if device:
        return device
    if host in ("0.0.0.0", "::", ""):
        return None
    address = ipaddress.ip_address(socket.getaddrinfo(host, None)[0][4][0])
    if address.is_loopback:
        return "lo"
    for _, name in socket.if_nameindex():
        if interface_address(name) == str(address):
            return name
    raise RuntimeError(
        f"no network interface holds --host {host} ({address}; IPv4 interfaces are searched); "
        "name the KV transfer's device with --disaggregation-ib-device"
    )


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface `name`, or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])
