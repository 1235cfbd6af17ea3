"""Mail over SMTP.

The server is named by a URL, ``$LIFECYCLE_SMTP_URL`` by default: ``smtp://HOST[:PORT]``
(port 25), ``smtp+starttls://HOST[:PORT]`` (port 587, STARTTLS) or ``smtps://HOST[:PORT]``
(port 465, TLS from the start), each optionally with ``USER:PASSWORD@`` for AUTH. The sender
is ``$LIFECYCLE_SMTP_FROM`` (default ``lifecycle@localhost``).

No header can be injected: addresses must be plain ``local@domain`` (no spaces, quotes,
angle brackets or line breaks), subjects lose their control characters, and the message is
built with the ``email`` package's strict SMTP policy, which refuses a line break in any
header. A body of plain ASCII text is sent as it is (7bit), any other as quoted-printable.
The ``Message-ID`` is derived from the effect's idempotency key, so a message sent
again after a crash carries the same id and a receiver can drop the duplicate.

A 5xx answer (the server will never take this message) raises :class:`PermanentError`;
anything else (connection refused, a 4xx "try again later", a timeout) is retryable.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote, urlsplit

from .. import redact
from ..errors import PermanentError, RetryableError, SetupError
from ..logs import logger

if TYPE_CHECKING:  # (email and smtplib are imported when a message is built or sent, not
    # by every process that loads job_exit: the worker that runs other machines' effects)
    from email.message import EmailMessage


class MailConfigError(SetupError):
    """The SMTP settings are missing or wrong."""

log = logger(__name__)

URL_VARIABLE = "LIFECYCLE_SMTP_URL"
FROM_VARIABLE = "LIFECYCLE_SMTP_FROM"
DEFAULT_FROM = "lifecycle@localhost"

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_LOCAL = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PORTS = {"smtp": 25, "smtp+starttls": 587, "smtps": 465}


def address_problem(address: str) -> str | None:
    """Why ``address`` is not a plain ``local@domain`` address, or None when it is."""
    if not isinstance(address, str) or len(address) > 254:
        return "is not an address of at most 254 characters"
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        return "is not of the form local@domain"
    if not _LOCAL.match(local) or len(local) > 64:
        return (f"has a local part {local!r} that is not a plain dot-atom (no spaces, quotes, "
                "angle brackets or control characters)")
    if not _DOMAIN.match(domain):
        return f"has a domain {domain!r} that is not a host name"
    return None


def checked_address(address: str, what: str) -> str:
    problem = address_problem(address)
    if problem is not None:
        raise ValueError(f"{what} {address!r} {problem}")
    return address


def message_id(idempotency_key: str, domain: str) -> str:
    """A ``Message-ID`` that is the same for every attempt of one effect."""
    digest = hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:40]
    if not _DOMAIN.match(domain):
        domain = "localhost"
    return f"<{digest}@{domain}>"


def build_message(*, sender: str, recipient: str, subject: str, body: str,
                  message_id: str, date: dt.datetime) -> EmailMessage:
    """A plain-text message. Raises ValueError for an address that is not plain."""
    import email.policy
    import email.utils
    from email.message import EmailMessage

    message = EmailMessage(policy=email.policy.SMTP)
    message["From"] = checked_address(sender, "sender")
    message["To"] = checked_address(recipient, "recipient")
    message["Subject"] = _CONTROL.sub(" ", subject)
    message["Date"] = email.utils.format_datetime(date.astimezone(dt.UTC))
    message["Message-ID"] = message_id
    message["Auto-Submitted"] = "auto-generated"
    # plain 7-bit text, as HTCondor's mail is, when it can be; else quoted-printable
    plain = body.isascii() and all(len(line) <= 998 for line in body.splitlines())
    message.set_content(body, charset="utf-8", cte="7bit" if plain else "quoted-printable")
    return message


@dataclass(frozen=True, slots=True)
class SmtpServer:
    """Where mail goes, from an ``smtp://`` URL."""

    scheme: str
    host: str
    port: int
    user: str | None = None
    password: str | None = None

    @classmethod
    def from_url(cls, url: str) -> SmtpServer:
        # the user information ends at the last '@', so a password may hold '/', '@' or ':'
        # (urlsplit would take a '/' in it for the start of a path)
        head, user, password, rest = redact.split_credentials(url)
        parts = urlsplit(head + rest)
        scheme = parts.scheme.lower()
        if scheme not in _PORTS:
            raise MailConfigError(f"{URL_VARIABLE}: {_shown(url)!r} is not an SMTP URL; write "
                                  "smtp://HOST[:PORT], smtp+starttls://... or smtps://...")
        try:
            port = parts.port or _PORTS[scheme]
        except ValueError:
            raise MailConfigError(f"{URL_VARIABLE}: {_shown(url)!r} has an invalid port") from None
        if not parts.hostname:
            raise MailConfigError(f"{URL_VARIABLE}: {_shown(url)!r} names no host")
        return cls(scheme, parts.hostname, port, unquote(user) if user else None,
                   unquote(password) if password else None)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def _shown(url: str) -> str:
    """The URL without its password, whatever the password holds (``/``, ``@``, ``:``)."""
    return redact.url(url)


class Mailer(Protocol):
    """Sends one message to one recipient. Raises :class:`PermanentError` when the message
    can never be delivered, anything else when trying again may help."""

    @property
    def sender(self) -> str:
        """The address mail comes from."""
        ...

    def send(self, message: EmailMessage, recipient: str) -> None: ...


class SmtpMailer:
    """Sends over SMTP, to ``url`` or (read at each send) ``$LIFECYCLE_SMTP_URL``."""

    def __init__(self, url: str | None = None, *, sender: str | None = None,
                 timeout: float = 30.0) -> None:
        self.url = url
        self._sender = sender
        self.timeout = timeout

    @property
    def sender(self) -> str:
        return self._sender or os.environ.get(FROM_VARIABLE) or DEFAULT_FROM

    def server(self) -> SmtpServer:
        url = self.url or os.environ.get(URL_VARIABLE)
        if not url:
            raise MailConfigError(f"no SMTP server: set {URL_VARIABLE}, e.g. "
                                  "smtp://127.0.0.1:25")
        return SmtpServer.from_url(url)

    def send(self, message: EmailMessage, recipient: str) -> None:
        import smtplib
        import ssl

        try:
            server = self.server()
        except MailConfigError as exc:
            raise PermanentError(str(exc)) from None
        try:
            client: smtplib.SMTP
            if server.scheme == "smtps":
                client = smtplib.SMTP_SSL(server.host, server.port, timeout=self.timeout,
                                          context=ssl.create_default_context())
            else:
                client = smtplib.SMTP(server.host, server.port, timeout=self.timeout)
            with client:
                if server.scheme == "smtp+starttls":
                    client.starttls(context=ssl.create_default_context())
                if server.user is not None:
                    client.login(server.user, server.password or "")
                client.send_message(message, from_addr=self.sender, to_addrs=[recipient])
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            _raise_for(min(codes) if codes else 0, f"{server} refused {recipient}: "
                       f"{exc.recipients}", exc)
        except smtplib.SMTPResponseException as exc:
            text = exc.smtp_error.decode("utf-8", "replace") if isinstance(
                exc.smtp_error, bytes) else str(exc.smtp_error)
            _raise_for(exc.smtp_code, f"{server} answered {exc.smtp_code} {text}", exc)
        log.info("mail %s to %s sent through %s", message["Message-ID"], recipient, server)


def _raise_for(code: int, message: str, cause: Exception) -> None:
    if 500 <= code < 600:
        raise PermanentError(message) from cause
    raise RetryableError(message) from cause


__all__ = ["DEFAULT_FROM", "FROM_VARIABLE", "URL_VARIABLE", "MailConfigError", "Mailer",
           "SmtpMailer", "SmtpServer", "address_problem",
           "build_message", "checked_address", "message_id"]
