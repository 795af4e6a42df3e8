"""TLS on the client port: the bundled client logs in, sends and receives over it; a
plaintext client gets nothing; a bad configuration is refused with a clear message."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from gateway.client import Client
from gateway.client.errors import ConnectionLost
from gateway.config import Config, ConfigError
from protocol.frames import Login, LoginOk, Push
from tests import conftest
from tests.conftest import StartGateway
from tests.support.wire import Closed, Wire, token

pytestmark = pytest.mark.backends("embedded")


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[tuple[trustme.CA, Path, Path]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain, key = tmp_path / "chain.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    yield ca, chain, key


def _client_ctx(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


async def test_bundled_client_chats_over_tls(
    start_gateway: StartGateway, pki: tuple[trustme.CA, Path, Path]
) -> None:
    ca, chain, key = pki
    gw = await start_gateway(tls_cert=str(chain), tls_key=str(key))
    addr = f"127.0.0.1:{gw.port}"
    tls = _client_ctx(ca)
    async with (
        Client(addr, 1, "d", token(1, "d"), tls=tls) as alice,
        Client(addr, 2, "d", token(2, "d"), tls=tls) as bob,
    ):
        conv = await alice.open_p2p(2)
        ack = await alice.send(conv, b"over tls")
        while True:
            event = await bob.next_event(5)
            if isinstance(event, Push):
                break
        assert (event.conv_id, event.seq, event.content) == (conv, ack.seq, b"over tls")
        await alice.ping()

    # a plaintext client does not get a LOGIN_OK from the TLS port
    plain = await Wire.open(gw.port)
    await plain.send(Login(1, 1, 4, "d", token(4, "d")))
    try:
        reply = await plain.recv(timeout=3)
    except (AssertionError, Closed, TimeoutError, ConnectionError):
        reply = None  # a TLS alert (undecodable as a frame), a close, or silence
    assert not isinstance(reply, LoginOk)

    # nor does a client that does not trust the certificate
    untrusting = Client(addr, 3, "d", token(3, "d"), tls=ssl.create_default_context(),
                        reconnect=False)  # fmt: skip
    with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
        await asyncio.wait_for(untrusting.connect(), 10)


def test_tls_settings_are_checked(tmp_path: Path, pki: tuple[trustme.CA, Path, Path]) -> None:
    _, chain, key = pki

    def config(**kw: str) -> Config:
        return conftest.make_config(tmp_path, port=7070, **kw)

    with pytest.raises(ConfigError, match="both"):
        config(tls_cert=str(chain)).validate()
    with pytest.raises(ConfigError, match="readable"):
        config(tls_cert=str(tmp_path / "nope.pem"), tls_key=str(key)).validate()
    with pytest.raises(ConfigError, match="cannot load"):
        config(tls_cert=str(key), tls_key=str(key)).tls_context()
    ok = config(tls_cert=str(chain), tls_key=str(key))
    ok.validate()
    assert ok.tls_context() is not None and config().tls_context() is None
