"""Secrets out of what the gateway shows: logs, error messages, /metrics, the command
lines of its processes, the bench's results.

- `redact_url(url)` masks what a URL carries as a credential: the password of its
  userinfo and the values of query parameters named like a secret (password, token,
  key, ...), in URLs nested in the query too.
- `redact_argv(argv)` masks the values of secret options (--token-key KID:***,
  --admin-token ***) and the credentials of URL arguments.
- `config_secrets(config)` lists the secret values of a configuration: token keys,
  tokens, the media secret, URL passwords and secret query values.
- `Redactor` masks known secret values and any URL credential in free text; called as
  a structlog processor it does so in every value of an event. The process has one,
  `REDACTOR`, that the log configuration (gateway.logs) runs last, behind the call
  sites that redact their own URLs, so a secret that slips into an error text from a
  driver still never reaches the log.

Pure functions of their arguments, but for `REDACTOR`, which `remember` fills.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any, Final
from urllib.parse import quote, unquote, unquote_plus, urlsplit, urlunsplit

MASK: Final = "***"
# Query parameters and options whose values are credentials.
_SECRET_NAME: Final = re.compile(
    r"pass|pwd|secret|token|key|auth|credential|signature", re.IGNORECASE
)
# Known values shorter than this are not masked in free text (masking "pw" or "1"
# everywhere would garble the logs); URL passwords are masked whatever their length.
MIN_SECRET_LEN: Final = 4
# Values that look like secrets and are not: the development key's secret is printed
# in the README, and `imgw serve` names it when it falls back to it (gateway.cli).
PUBLIC: Final = frozenset({"imgw-dev-secret"})

# scheme://user:password@ in free text: the password is what lies between the first
# ':' of the userinfo and its last '@' (a password may hold an unquoted '@').
_USERINFO: Final = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@'\"]*:)(?P<pw>[^\s/?#'\"]*)@"
)
# ?name=value and &name=value with a secret-sounding name, in free text.
_PARAM: Final = re.compile(r"(?P<head>[?&;](?P<name>[^=&\s?#'\"]*)=)(?P<value>[^&\s#'\"]*)")


def _mask_param(m: re.Match[str]) -> str:
    if m["value"] and _SECRET_NAME.search(m["name"]):
        return m["head"] + MASK
    return m[0]


def _mask_urls(text: str) -> str:
    """Credentials of every URL in `text`: userinfo passwords, secret query values."""
    if "://" in text:
        text = _USERINFO.sub(lambda m: m["head"] + (MASK if m["pw"] else "") + "@", text)
    if "=" in text:
        text = _PARAM.sub(_mask_param, text)
    return text


def redact_url(url: str) -> str:
    """`url` with its password and secret query values masked (the same URL when it
    carries none); nested URLs in the query are redacted too."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _mask_urls(url)
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if at and colon and password:
        netloc = f"{user}:{MASK}@{hosts}"
    query = "&".join(_redact_param(piece) for piece in parts.query.split("&"))
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _query_values(query: str) -> Iterable[tuple[str, str, str]]:
    """(name, value as written, value decoded) of each parameter of a query."""
    for piece in query.split("&"):
        name, _, raw = piece.partition("=")
        yield unquote_plus(name), raw, unquote_plus(raw)


def _redact_param(piece: str) -> str:
    name, eq, raw = piece.partition("=")
    if not raw:
        return piece
    if _SECRET_NAME.search(unquote_plus(name)):
        return f"{name}{eq}{MASK}"
    if "://" in raw:
        return f"{name}{eq}{redact_url(raw)}"
    value = unquote_plus(raw)
    if "://" in value:
        masked = redact_url(value)
        return piece if masked == value else f"{name}{eq}{quote(masked, safe='*')}"
    return piece


def url_secrets(url: str) -> set[str]:
    """The secret values `url` carries (as written and decoded): its password, its
    secret query values, those of URLs nested in its query."""
    found: set[str] = set()
    try:
        parts = urlsplit(url)
    except ValueError:
        return found
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        password = userinfo.partition(":")[2]
        found |= {password, unquote(password)}
    for name, raw, value in _query_values(parts.query):
        if value and _SECRET_NAME.search(name):
            found |= {raw, value, unquote(raw)}
        elif "://" in value:
            found |= url_secrets(value)
    return {s for s in found if s}


# Options whose value is a secret (--token-key, --admin-token, --media-secret, imgw
# chat's --key) and those that only sound like one.
_SECRET_OPTION: Final = re.compile(r"(secret|token|password|key)$")
_NOT_SECRET_OPTIONS: Final = frozenset({"--tls-key"})  # a file's path
_SECRET_FIELD: Final = re.compile(r"secret|token|password|api_key", re.IGNORECASE)


def _secret_of(field: str, item: str) -> str:
    """The secret in one value of a secret field: after KID: in a token key, between
    NAME: and :SCOPES in an API key, else the whole value."""
    if field == "token_keys" and ":" in item:
        return item.partition(":")[2]
    if field == "api_keys" and item.count(":") >= 2:
        return item.partition(":")[2].rpartition(":")[0]
    return item


def config_secrets(config: Any) -> set[str]:
    """The secret values of a configuration dataclass (gateway.config.Config): fields
    named like a secret (token keys: the part after KID:; API keys: the part between
    NAME: and :SCOPES), and the credentials of every
    URL-valued field."""
    found: set[str] = set()
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        values = value if isinstance(value, tuple) else (value,)
        for item in values:
            if not isinstance(item, str) or not item:
                continue
            if _SECRET_FIELD.search(f.name):
                found.add(_secret_of(f.name, item))
            elif "://" in item:
                found |= url_secrets(item)
    store_url = getattr(config, "store_url", None)
    if callable(store_url):
        found |= url_secrets(store_url())
    return found


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the values of secret options masked (``--token-key
    KID:***``, ``--admin-token=***``) and the credentials of URL arguments."""
    out: list[str] = []
    secret_next: str | None = None
    for arg in argv:
        if secret_next is not None:
            out.append(_mask_option(secret_next, arg))
            secret_next = None
            continue
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            if _SECRET_OPTION.search(name) and name not in _NOT_SECRET_OPTIONS:
                if eq:
                    out.append(f"{name}={_mask_option(name, value)}")
                else:
                    secret_next = name
                    out.append(arg)
                continue
        out.append(_mask_urls(arg))
    return out


def _mask_option(name: str, value: str) -> str:
    if "://" in value:
        masked = _mask_urls(value)
        if masked != value:
            return masked
    kid, sep, rest = value.partition(":")
    if name in ("--token-key", "--key") and sep:
        return f"{kid}:{MASK}"
    if name == "--api-key" and ":" in rest:
        return f"{kid}:{MASK}:{rest.rpartition(':')[2]}"
    return MASK if value else value


class Redactor:
    """Masks the secrets it was told (`add`) and any URL credential in text; a
    structlog processor that does so in every value of an event."""

    __slots__ = ("_pattern", "_secrets")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: frozenset[str] = frozenset()
        self._pattern: re.Pattern[str] | None = None
        self.add(secrets)

    @property
    def secrets(self) -> frozenset[str]:
        return self._secrets

    def add(self, secrets: Iterable[str]) -> None:
        new = {s for s in secrets if len(s) >= MIN_SECRET_LEN and s not in PUBLIC}
        if new <= self._secrets:
            return
        self._secrets = self._secrets | new
        # the longest first: a secret that contains another is masked whole
        ordered = sorted(self._secrets, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered)))

    def text(self, text: str) -> str:
        text = _mask_urls(text)
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return text

    def value(self, value: Any) -> Any:
        """`value` with its secrets masked: strings, and the strings in dicts, lists and
        tuples; another object is replaced by its masked repr only when that has one."""
        if isinstance(value, str):
            return self.text(value)
        if value is None or isinstance(value, int | float | bool):
            return value
        if type(value) is dict:
            return {k: self.value(v) for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self.value(v) for v in value)
        shown = repr(value)
        masked = self.text(shown)
        return value if masked == shown else masked

    def __call__(
        self, _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key, value in event.items():
            event[key] = self.value(value)
        return event


REDACTOR: Final = Redactor()
"""The process's redactor: the log configuration runs it on every event."""


def remember(secrets: Iterable[str]) -> None:
    """Mask these values in everything the process logs from now on."""
    REDACTOR.add(secrets)


def redact_text(text: str) -> str:
    """`text` with the process's known secrets and any URL credential masked."""
    return REDACTOR.text(text)
