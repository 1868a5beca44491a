"""A tiny SMTP server on 127.0.0.1 for the alert-mail tests (the standard library's smtpd: deprecated, present in 3.11)."""

from __future__ import annotations

import asyncore
import threading


class Mailbox:
    """Receives mail on 127.0.0.1 at ``port``; ``messages`` holds (sender, recipients, text) per mail."""

    def __init__(self):
        import smtpd as stdlib_smtpd  # deferred: importing it warns (deprecated) in every test that merely collects

        mailbox = self
        self.messages: list[tuple[str, list[str], str]] = []

        class Server(stdlib_smtpd.SMTPServer):
            def process_message(self, peer, mailfrom, rcpttos, data, **kwargs):
                mailbox.messages.append((mailfrom, rcpttos, data.decode() if isinstance(data, bytes) else data))

        self.server = Server(("127.0.0.1", 0), None)
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=asyncore.loop, kwargs={"timeout": 0.1}, daemon=True)
        self.thread.start()

    @property
    def texts(self) -> list[str]:
        """Each mail's text (headers and body)."""
        return [data for _, _, data in self.messages]

    def stop(self):
        self.server.close()
        self.thread.join(timeout=5)
