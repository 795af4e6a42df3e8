"""The served certificate's names and expiry (gateway.net.certinfo, gateway.net.tls) and the
handshake counters, on in-memory TLS (no socket): what the operator is told."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import random
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trustme

from gateway.metrics import Metrics
from gateway.net.certinfo import CertInfo, describe, parse_der, read_pem
from gateway.net.tls import (
    EXPIRY_WARN_DAYS,
    CertificateWatch,
    HandshakeStats,
    count_handshakes,
    summary,
)

NOW = 1_800_000_000.0  # 2027-01-15


class Log:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.records.append((level, event, kw))


def _cert(tmp_path: Path, *names: str, not_after: dt.datetime | None = None) -> Path:
    ca = trustme.CA()
    kw = {"not_after": not_after} if not_after is not None else {}
    leaf = ca.issue_cert(*names, **kw)
    path = tmp_path / "chain.pem"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(path))
    return path


def test_names_and_expiry_of_a_trustme_certificate(tmp_path: Path) -> None:
    until = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
    info = read_pem(_cert(tmp_path, "localhost", "127.0.0.1", "::1", not_after=until).read_text())
    assert info.names == ("localhost", "127.0.0.1", "::1")
    assert info.not_after == until.timestamp()
    assert describe(info) == "localhost, 127.0.0.1, ::1"


def test_names_and_expiry_of_an_openssl_certificate(tmp_path: Path) -> None:
    """The recipe's kind of certificate (docs/tls.md), and one with only a CN."""
    for subject, ext, names in (
        ("/CN=localhost", ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
         ("localhost", "127.0.0.1")),
        ("/O=imgw/CN=chat.example", [], ("chat.example",)),
    ):  # fmt: skip
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "30", "-subj", subject, *ext,
             "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem")],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        info = read_pem((tmp_path / "c.pem").read_text())
        assert info.names == names
        assert 29 < info.expires_in_days(dt.datetime.now(dt.UTC).timestamp()) <= 30


def test_a_malformed_certificate_raises_value_error_only(tmp_path: Path) -> None:
    pem = _cert(tmp_path, "localhost").read_text()
    der = ssl.PEM_cert_to_DER_cert(pem[pem.index("-----BEGIN CERTIFICATE") :])
    rng = random.Random(7)
    for n in [*range(0, len(der), 7), len(der) - 1]:
        with pytest.raises(ValueError):
            parse_der(der[:n])
    for _ in range(2000):
        bad = bytearray(der)
        for _ in range(3):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        with contextlib.suppress(ValueError):  # or accepted: the flips hit nothing it reads
            parse_der(bytes(bad))
    with pytest.raises(ValueError, match="no PEM certificate"):
        read_pem("-----BEGIN PRIVATE KEY-----\n")


def test_the_watch_logs_the_certificate_and_warns_before_it_expires(tmp_path: Path) -> None:
    until = dt.datetime.fromtimestamp(NOW + 30 * 86_400, dt.UTC)
    path = _cert(tmp_path, "localhost", "127.0.0.1", not_after=until)
    clock = [NOW]
    log, metrics = Log(), Metrics()
    watch = CertificateWatch(str(path), log, metrics, clock=lambda: clock[0])
    watch.started()
    assert log.records == [
        ("info", "TLS on", {"names": "localhost, 127.0.0.1", "expires": "2027-02-14 08:00 UTC",
                            "days_left": 30}),
    ]  # fmt: skip
    assert summary(watch.info) == "on (localhost, 127.0.0.1; expires 2027-02-14 08:00 UTC)"
    assert b"imgw_tls_certificate_expiry_timestamp_seconds 1.802592e+09" in metrics.render()
    clock[0] = NOW + (30 - EXPIRY_WARN_DAYS - 1) * 86_400  # a day before the warnings
    watch.check()
    assert len(log.records) == 1
    clock[0] += 2 * 86_400  # the daily check a day later: 13 days left
    watch.check()
    level, event, fields = log.records[-1]
    assert (level, fields["days_left"]) == ("warning", 13.0)
    assert "expires within 14 days" in event
    clock[0] = NOW + 31 * 86_400
    watch.check()
    assert log.records[-1][0] == "error" and "has expired" in log.records[-1][1]


def test_an_unreadable_certificate_is_said_and_not_fatal(tmp_path: Path) -> None:
    log = Log()
    (tmp_path / "x.pem").write_text("not a certificate")
    watch = CertificateWatch(str(tmp_path / "x.pem"), log, Metrics())
    watch.started()
    assert watch.info is None and summary(None) == "on"
    assert log.records[0][:2] == ("warning", "TLS certificate: cannot read its names and expiry")


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext | None, host: str,
               raw: bytes = b"", *, alert: bool = True, rounds: int = 10) -> None:  # fmt: skip
    """One handshake over memory BIOs, as far as `rounds` go; `client` None: the
    server reads `raw` instead. `alert` False: a failing client leaves without its
    alert (as asyncio does)."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    with contextlib.suppress(ssl.SSLWantReadError):
        srv.do_handshake()  # as the connection opens, before the client said anything
    cli = client.wrap_bio(c_in, c_out, server_hostname=host) if client else None
    if cli is None:
        if not raw:
            return  # nothing came: the server is not called again (uvloop calls it per read)
        s_in.write(raw)
    for _ in range(rounds):
        for obj, out, peer in ((cli, c_out, s_in), (srv, s_out, c_in)):
            if obj is None:
                continue
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                if not alert:
                    return
                if out.pending:  # the alert, for the other side to read
                    peer.write(out.read())
                if obj is cli:
                    with pytest.raises(ssl.SSLError):
                        srv.do_handshake()
                return
            if out.pending:
                peer.write(out.read())


def test_handshakes_are_counted_by_outcome(tmp_path: Path) -> None:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    stats, metrics = HandshakeStats(), Metrics()
    metrics.watch_tls(stats, None)
    count_handshakes(server, stats)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    _handshake(server, trusting, "localhost")
    _handshake(server, trusting, "localhost")
    _handshake(server, ssl.create_default_context(), "localhost")  # does not trust it
    _handshake(server, trusting, "127.0.0.1")  # not a name of it
    _handshake(server, None, "", b"\x00\x00\x00\x21\x81\xa2op\x01")  # a plain LOGIN
    _handshake(server, None, "", b"GET / HTTP/1.1\r\n\r\n")  # a browser, curl
    # refused without an alert, gone after the ClientHello: abandoned, once freed
    _handshake(server, ssl.create_default_context(), "localhost", alert=False)
    _handshake(server, trusting, "localhost", rounds=1)
    _handshake(server, None, "", b"")  # connected and left: no handshake to fail
    gc.collect()  # the objects are freed with their connections (here: now)
    text = metrics.render().decode()
    assert "imgw_tls_handshakes_total 2.0" in text
    assert stats.failed == {
        "tlsv1_alert_unknown_ca": 1, "sslv3_alert_bad_certificate": 1,
        "wrong_version_number": 1, "http_request": 1, "abandoned": 2,
    }  # fmt: skip
    assert 'imgw_tls_handshake_failures_total{reason="abandoned"} 2.0' in text
    assert "imgw_tls_certificate_expiry" not in text  # no certificate given


def test_cert_info_days() -> None:
    assert CertInfo(("a",), "a", NOW + 86_400).expires_in_days(NOW) == 1.0
