"""Passwords out of every URL lifecycle shows, logs or stores.

A URL's password is whatever lies between the first ``:`` of its user information and the
``@`` that ends it, and a password may itself hold ``:``, ``/`` or ``@`` when it is not
percent-encoded (``smtp://bob:Hunter2/Secret@host``). The user information therefore ends at
the *last* ``@`` of the URL; what comes before it, after the user's name, is hidden
(``bob:***@host``). So are the values of query parameters that hold secrets
(``?password=...``). Hiding too much is harmless here; showing a secret is not.

:func:`url` hides the password of one URL; :func:`text` hides the passwords of every URL in
a message (an exception's text, a log line), wherever it is.
"""

from __future__ import annotations

import re

HIDDEN = "***"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SECRET_PARAMETER = re.compile(
    r"(?i)([?&;](?:password|passwd|pwd|sslpassword|secret|token|api_?key)=)[^&#\s]*")
# a URL inside a message runs to the next blank or quote
_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*")


def url(address: str) -> str:
    """``address`` with its password (and secret query parameters) replaced by ``***``."""
    head, user, password, rest = split_credentials(address)
    if password is not None:
        address = f"{head}{user}:{HIDDEN}@{rest}"
    return _SECRET_PARAMETER.sub(rf"\1{HIDDEN}", address)


def text(message: str) -> str:
    """``message`` with the password of every URL in it hidden."""
    if "://" not in message:
        return _SECRET_PARAMETER.sub(rf"\1{HIDDEN}", message) if "=" in message else message
    return _IN_TEXT.sub(lambda m: url(m.group()), message)


def split_credentials(address: str) -> tuple[str, str | None, str | None, str]:
    """(``scheme://``, user, password, the rest after the ``@``) of a URL whose user
    information ends at its last ``@``; user and password None when it has none."""
    found = _SCHEME.match(address)
    if found is None:
        return "", None, None, address
    head, rest = address[: found.end()], address[found.end():]
    at = rest.rfind("@")
    if at < 0:
        return head, None, None, rest
    user, colon, password = rest[:at].partition(":")
    if any(c in user for c in "/?#"):  # an '@' in the path or query, not user information
        return head, None, None, rest
    return head, user, password if colon else None, rest[at + 1:]


__all__ = ["HIDDEN", "split_credentials", "text", "url"]
