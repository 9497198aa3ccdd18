"""SSRF guard: which URLs and addresses the crawler may contact.

Checked twice: ``check_url`` before a request (scheme, host, literal IPs; aiohttp skips the resolver
for IP literals) and ``GuardedResolver`` inside the connector, which returns only checked addresses,
so the socket connects to exactly the address that was checked (no DNS rebinding window). Every
redirect hop goes through both again. An allowlist of ``host:port`` pairs opts in to internal
targets (the local corpus site in demos and tests).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

ALLOWED_SCHEMES = ("http", "https")
# Cloud metadata endpoints (AWS/GCP/Azure/OpenStack share 169.254.169.254; AWS IPv6; Alibaba; Azure wire)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "168.63.129.16")
)
_CGNAT = ipaddress.ip_network("100.64.0.0/10")


class UnsafeURLError(OSError):
    """The URL or the address its host resolves to is not allowed (an OSError so aiohttp wraps it)."""


def forbidden_reason(address: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address must not be contacted, or None when it is a public unicast address."""
    ip = ipaddress.ip_address(address.split("%")[0] if isinstance(address, str) else address)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            inner = forbidden_reason(embedded)
            return f"{inner} (embedded in {ip})" if inner else None
    if ip in METADATA_ADDRESSES:
        return f"cloud metadata address {ip}"
    checks = (
        (ip.is_loopback, "loopback"), (ip.is_link_local, "link-local"), (ip.is_multicast, "multicast"),
        (ip.is_unspecified, "unspecified"), (ip.is_private, "private"), (ip.is_reserved, "reserved"),
        (isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT, "shared (CGNAT)"),
    )
    for hit, name in checks:
        if hit:
            return f"{name} address {ip}"
    return None


class Allowlist:
    """``host:port`` pairs that may be contacted even when they resolve to internal addresses."""

    def __init__(self, entries: Iterable[str] = ()):
        self._pairs = frozenset(self._parse(e) for e in entries)

    @staticmethod
    def _parse(entry: str) -> tuple[str, int]:
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"allowlist entry must be host:port, got {entry!r}")
        return host.strip("[]").lower(), int(port)

    def allows(self, host: str, port: int) -> bool:
        return (host.strip("[]").lower(), port) in self._pairs

    def __repr__(self) -> str:
        return f"Allowlist({sorted(f'{h}:{p}' for h, p in self._pairs)})"


def check_url(url: str, allowlist: Allowlist) -> None:
    """Refuse non-http(s) schemes, missing hosts, and literal internal IPs (not allowlisted)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ALLOWED_SCHEMES:
        raise UnsafeURLError(f"scheme {parts.scheme!r} not allowed in {url!r}")
    host = parts.hostname
    if not host:
        raise UnsafeURLError(f"no host in {url!r}")
    try:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError as exc:
        raise UnsafeURLError(f"bad port in {url!r}") from exc
    if allowlist.allows(host, port):
        return
    try:
        ipaddress.ip_address(host)
    except ValueError:
        legacy = _legacy_ipv4(host)
        if legacy is not None:  # 2130706433, 127.1, 0x7f000001: ambiguous between parsers
            raise UnsafeURLError(f"refused {host}:{port}: non-canonical numeric IPv4 host (= {legacy})") from None
        return  # a name: checked after resolution by GuardedResolver
    reason = forbidden_reason(host)
    if reason:
        raise UnsafeURLError(f"refused {host}:{port}: {reason}")


def _legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address inet_aton reads from a numeric host that is not dotted-quad, else None (no DNS)."""
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


class GuardedResolver(AbstractResolver):
    """Resolves through ``inner`` and keeps only addresses that pass ``forbidden_reason``."""

    def __init__(self, allowlist: Allowlist, inner: AbstractResolver | None = None):
        self._allowlist = allowlist
        self._inner = inner

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET):
        if self._inner is None:
            self._inner = DefaultResolver()
        results = await self._inner.resolve(host, port, family)
        if self._allowlist.allows(host, port):
            return results
        safe, reasons = [], []
        for result in results:
            reason = forbidden_reason(result["host"])
            (reasons.append(reason) if reason else safe.append(result))
        if not safe:
            raise UnsafeURLError(f"refused {host}:{port}: resolves to {'; '.join(reasons) or 'nothing'}")
        return safe

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()
