"""A real SMTP server on loopback (aiosmtpd) that keeps every message it accepts, and can be
told to refuse the first ones with a 4xx (try again later) or a 5xx (never)."""

from __future__ import annotations

import email
import email.policy
import socket
import threading
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller


@dataclass(frozen=True)
class Received:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def message_id(self) -> str:
        return str(self.message["Message-ID"])

    @property
    def body(self) -> str:
        """The text, with the wire's CRLF line ends as newlines."""
        return str(self.message.get_content()).replace("\r\n", "\n")


class MailSink:
    """``with MailSink() as sink:`` serves SMTP on ``sink.url`` until the block ends."""

    def __init__(self, *, refuse: int = 0, reply: str = "451 4.3.0 Try again later") -> None:
        self.refuse = refuse
        self.reply = reply
        self.received: list[Received] = []
        self.refused = 0
        self._lock = threading.Lock()
        self.port = _free_port()
        self._controller = Controller(self, hostname="127.0.0.1", port=self.port)

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self._lock:
            if self.refused < self.refuse:
                self.refused += 1
                return self.reply
            parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
            assert isinstance(parsed, EmailMessage)
            self.received.append(Received(envelope.mail_from, tuple(envelope.rcpt_tos),
                                          parsed))
        return "250 2.0.0 Message accepted for delivery"

    def by_subject(self) -> dict[str, list[Received]]:
        out: dict[str, list[Received]] = {}
        with self._lock:
            for mail in self.received:
                out.setdefault(mail.subject, []).append(mail)
        return out

    def __enter__(self) -> MailSink:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
