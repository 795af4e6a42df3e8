"""What a certificate names and until when: enough of X.509 to say so in a log line or an
error message, read from its DER bytes (the standard library decodes a certificate only
from a verified peer, and the gateway needs its own certificate's names too).

Reads the subject's common name, the subjectAltName's DNS names and IP addresses, and
the end of the validity period; anything else in the certificate is skipped. A
malformed certificate raises ValueError, never anything else.
"""

from __future__ import annotations

import calendar
import ipaddress
import ssl
from dataclasses import dataclass
from typing import Final

_SEQUENCE: Final = 0x30
_SET: Final = 0x31
_OID: Final = 0x06
_UTC_TIME: Final = 0x17
_GENERALIZED_TIME: Final = 0x18
_VERSION: Final = 0xA0  # [0] EXPLICIT in TBSCertificate
_EXTENSIONS: Final = 0xA3  # [3] EXPLICIT in TBSCertificate
_DNS_NAME: Final = 0x82  # [2] IMPLICIT IA5String in GeneralName
_IP_ADDRESS: Final = 0x87  # [7] IMPLICIT OCTET STRING in GeneralName
_OID_COMMON_NAME: Final = bytes([0x55, 0x04, 0x03])  # 2.5.4.3
_OID_SUBJECT_ALT_NAME: Final = bytes([0x55, 0x1D, 0x11])  # 2.5.29.17


@dataclass(frozen=True, slots=True)
class CertInfo:
    """`names`: the subjectAltName's DNS names and IP addresses, in the certificate's
    order, or the subject's common name when it has none (clients check the names
    against the host they connect to); `not_after`: the end of its validity, epoch
    seconds."""

    names: tuple[str, ...]
    common_name: str
    not_after: float

    def expires_in_days(self, now: float) -> float:
        return (self.not_after - now) / 86_400


def _tlv(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the element at `pos`."""
    if pos + 2 > end:
        raise ValueError("truncated certificate")
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        if not 0 < n <= 4 or pos + n > end:
            raise ValueError("bad length in certificate")
        length = int.from_bytes(data[pos : pos + n], "big")
        pos += n
    if pos + length > end:
        raise ValueError("truncated certificate")
    return tag, pos, pos + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    pos = start
    while pos < end:
        tag, vstart, vend = _tlv(data, pos, end)
        out.append((tag, vstart, vend))
        pos = vend
    return out


def _time(tag: int, raw: bytes) -> float:
    text = raw.decode("ascii")
    if not text.endswith("Z"):
        raise ValueError("certificate time not in UTC")
    if tag == _UTC_TIME:  # YYMMDDHHMM[SS]Z, years 1950..2049
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != _GENERALIZED_TIME:
        raise ValueError("bad time in certificate")
    digits = text[:-1].split(".")[0]
    if len(digits) == 12:
        digits += "00"
    if len(digits) != 14 or not digits.isdigit():
        raise ValueError("bad time in certificate")
    fields = [int(digits[:4])] + [int(digits[i : i + 2]) for i in range(4, 14, 2)]
    return float(calendar.timegm((*fields, 0, 0, 0)))


def _common_name(data: bytes, start: int, end: int) -> str:
    for _, set_start, set_end in _children(data, start, end):
        for _, at_start, at_end in _children(data, set_start, set_end):
            parts = _children(data, at_start, at_end)
            oid = data[parts[0][1] : parts[0][2]] if len(parts) == 2 else b""
            if parts[0][0] == _OID and oid == _OID_COMMON_NAME:
                return data[parts[1][1] : parts[1][2]].decode("utf-8", "replace")
    return ""


def _alt_names(data: bytes, start: int, end: int) -> list[str]:
    names: list[str] = []
    (tag, seq_start, seq_end), *_ = _children(data, start, end) or [(0, 0, 0)]
    if tag != _SEQUENCE:
        raise ValueError("bad subjectAltName")
    for tag, vstart, vend in _children(data, seq_start, seq_end):
        if tag == _DNS_NAME:
            names.append(data[vstart:vend].decode("ascii", "replace"))
        elif tag == _IP_ADDRESS and vend - vstart in (4, 16):
            names.append(str(ipaddress.ip_address(data[vstart:vend])))
    return names


def parse_der(der: bytes) -> CertInfo:
    """The names and expiry of a DER-encoded X.509 certificate."""
    try:
        tag, start, end = _tlv(der, 0, len(der))
        if tag != _SEQUENCE:
            raise ValueError("not a certificate")
        tag, start, end = _tlv(der, start, end)  # TBSCertificate
        if tag != _SEQUENCE:
            raise ValueError("not a certificate")
        fields = _children(der, start, end)
        if fields and fields[0][0] == _VERSION:
            fields = fields[1:]
        if len(fields) < 6:
            raise ValueError("not a certificate")
        _serial, _algorithm, _issuer, validity, subject, _key, *rest = fields
        times = _children(der, validity[1], validity[2])
        if len(times) != 2:
            raise ValueError("bad validity in certificate")
        not_after = _time(times[1][0], der[times[1][1] : times[1][2]])
        common_name = _common_name(der, subject[1], subject[2])
        names: list[str] = []
        for tag, vstart, vend in rest:
            if tag != _EXTENSIONS:
                continue
            (_, seq_start, seq_end), *_ = _children(der, vstart, vend)
            for _, ext_start, ext_end in _children(der, seq_start, seq_end):
                parts = _children(der, ext_start, ext_end)
                if parts and der[parts[0][1] : parts[0][2]] == _OID_SUBJECT_ALT_NAME:
                    value = parts[-1]  # after the optional `critical` flag
                    names = _alt_names(der, value[1], value[2])
    except (IndexError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"cannot read the certificate: {e}") from None
    return CertInfo(tuple(names) or ((common_name,) if common_name else ()), common_name,
                    not_after)  # fmt: skip


def read_pem(text: str) -> CertInfo:
    """The first certificate of a PEM chain (the server's own, by convention)."""
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError("no PEM certificate found")
    try:
        der = ssl.PEM_cert_to_DER_cert(text[start : stop + len(end)])
    except ValueError as e:
        raise ValueError(f"cannot read the certificate: {e}") from None
    return parse_der(der)


def describe(info: CertInfo) -> str:
    """`localhost, 127.0.0.1` (the names a client may connect by)."""
    return ", ".join(info.names) or "no names"
