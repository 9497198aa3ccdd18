"""SSRF guard. Address checks are unit tests that open no connection; end-to-end attempts use
loopback targets only (a port that is not allowlisted, a redirect from the allowlisted site)."""

import asyncio
import socket

import pytest
import pytest_asyncio

from retrievers.crawler import Crawler
from retrievers.crawler_config import CrawlerConfig
from retrievers.events import SourceError, collect
from retrievers.local_site import LocalSite, SiteConfig
from retrievers.netguard import Allowlist, GuardedResolver, UnsafeURLError, check_url, forbidden_reason

pytestmark = pytest.mark.timeout(30)

FORBIDDEN = {
    "10.1.2.3": "private", "172.16.0.9": "private", "192.168.1.1": "private", "127.0.0.1": "loopback",
    "127.8.9.10": "loopback", "::1": "loopback", "169.254.10.1": "link-local", "fe80::1": "link-local",
    "169.254.169.254": "metadata", "fd00:ec2::254": "metadata", "100.100.100.200": "metadata",
    "0.0.0.0": "unspecified", "100.64.1.1": "CGNAT", "fc00::1": "private", "224.0.0.1": "multicast",
    "::ffff:169.254.169.254": "metadata", "::ffff:10.0.0.1": "private",
}


@pytest.mark.parametrize("address,kind", FORBIDDEN.items())
def test_internal_addresses_are_forbidden(address, kind):
    assert kind in forbidden_reason(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address):
    assert forbidden_reason(address) is None


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x", "gopher://h/", "javascript:alert(1)",
                                 "http:///nohost", "http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/",
                                 "http://[::1]:8080/", "http://[fd00:ec2::254]/",
                                 "http://2852039166/", "http://0xa9.0xfe.0xa9.0xfe/"])
def test_check_url_refuses(url):
    with pytest.raises(UnsafeURLError):
        check_url(url, Allowlist())


def test_allowlist_is_host_and_port():
    allow = Allowlist(["127.0.0.1:8765"])
    check_url("http://127.0.0.1:8765/wiki/France", allow)
    with pytest.raises(UnsafeURLError):
        check_url("http://127.0.0.1:8766/", allow)
    with pytest.raises(ValueError):
        Allowlist(["127.0.0.1"])


class _FixedResolver:
    """Answers every lookup with the given addresses (stands in for DNS; opens no connection)."""

    def __init__(self, *addresses):
        self.addresses = addresses

    async def resolve(self, host, port=0, family=socket.AF_INET):
        return [{"hostname": host, "host": a, "port": port, "family": family, "proto": 0, "flags": 0}
                for a in self.addresses]

    async def close(self):
        pass


async def test_resolver_refuses_names_resolving_to_internal_addresses():
    for address in ("169.254.169.254", "10.0.0.5", "127.0.0.1", "fe80::2"):
        with pytest.raises(UnsafeURLError, match="refused"):
            await GuardedResolver(Allowlist(), _FixedResolver(address)).resolve("evil.example", 80)


async def test_resolver_keeps_only_checked_addresses():
    # A rebinding-style answer mixing a public and a private address: only the public one survives,
    # and the connector connects to what the resolver returned.
    results = await GuardedResolver(Allowlist(), _FixedResolver("10.0.0.5", "93.184.216.34")).resolve("x.example", 80)
    assert [r["host"] for r in results] == ["93.184.216.34"]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def site():
    async with LocalSite(SiteConfig(latency_scale=0)) as s:
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def bystander():
    """A loopback server that is NOT allowlisted; counts connections it receives."""
    hits = []

    async def on_connect(reader, writer):
        hits.append(1)
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield port, hits
    server.close()
    await server.wait_closed()


def _crawler(site):
    return Crawler(CrawlerConfig(allowlist=(site.allowlist_entry,), page_timeout_s=2.0))


async def test_not_allowlisted_loopback_port_refused(site, bystander):
    port, hits = bystander
    events = await collect(_crawler(site).stream(seeds=[f"http://127.0.0.1:{port}/admin"]))
    assert isinstance(events[0], SourceError) and "loopback" in events[0].reason
    assert hits == []


async def test_name_resolving_to_loopback_refused_after_dns(site, bystander):
    port, hits = bystander
    events = await collect(_crawler(site).stream(seeds=[f"http://localhost:{port}/"]))
    assert isinstance(events[0], SourceError) and "loopback" in events[0].reason
    # legacy numeric spellings of 127.0.0.1 are refused too (by aiohttp or by the resolver check)
    seeds = [f"http://2130706433:{port}/", f"http://127.1:{port}/", f"http://0x7f000001:{port}/"]
    events = await collect(_crawler(site).stream(seeds=seeds))
    assert [type(e) for e in events[:-1]] == [SourceError] * 3, events
    assert all("non-canonical numeric IPv4" in e.reason for e in events[:-1])
    assert hits == []


async def test_redirect_from_allowlisted_site_to_internal_port_refused(site, bystander):
    port, hits = bystander
    seeds = [f"{site.base_url}/fault/redirect?to=http://127.0.0.1:{port}/secret",
             f"{site.base_url}/fault/redirect?to=file:///etc/passwd", f"{site.base_url}/wiki/Japan"]
    events = await collect(_crawler(site).stream(seeds=seeds))
    reasons = sorted(e.reason for e in events if isinstance(e, SourceError))
    assert len(reasons) == 2
    assert any("loopback" in r for r in reasons) and any("scheme 'file'" in r for r in reasons)
    assert any(getattr(e, "url_or_doc_id", "").endswith("/wiki/Japan") for e in events)  # stream went on
    assert hits == []
