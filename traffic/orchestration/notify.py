"""Send the ``alerts`` table's rows through an Airflow notifier, each alert once (the hourly DAG's ``notify_alerts``).

``AlertNotifier`` is an Airflow notifier (``airflow.sdk.BaseNotifier``): it mails every alert it is
given through the SMTP connection ``alerts_smtp_conn_id`` (``TRAFFIC_ALERTS_SMTP_CONN_ID``, default
``smtp_default``; the smtp provider's ``SmtpHook``) to ``alerts_email_to`` when both are configured,
and otherwise writes one log line per alert. ``notify_pending`` hands it the alerts whose id is not
in ``<warehouse>/_traffic/alerts-sent.json`` yet and records each id there as soon as it is sent,
so a rerun, a backfill of the same hours or a replay that recomputes the same alerts (same ids)
sends nothing new. A crash between a send and its record can send that one alert again: at least
once, never lost. Alert text is data, never a Jinja template (the notifier templates no field), and
an account's name is escaped in the mail's subject (a newline there would end the header). One alert
the mail server refuses is logged with its reason and not recorded, and the alerts after it are
still mailed; at the end ``AlertsNotSent`` counts the failures, so the task fails and its retry (or
the next run) sends just those.
"""

from __future__ import annotations

import fcntl
import html
import json
import logging
from contextlib import contextmanager
from typing import Callable, Iterable

from airflow.sdk import BaseNotifier

from traffic.core.text import printable
from traffic.storage.place import Place

log = logging.getLogger(__name__)

SENT_FILE = "alerts-sent.json"


def describe(alert: dict) -> str:
    """One line a person reads: what was crossed, by whom, when."""
    if alert["kind"] == "quota":
        what = (f"bytes_total reached {alert['observed']:,} bytes, quota {alert['quota_bytes']:,} bytes")
    else:
        what = (f"95th percentile certain to exceed the commit of {alert['commit_bps']:,.0f} bit/s "
                f"({alert['observed']:,} of threshold {alert['threshold']:,} {alert['unit']}; at least "
                f"{alert['observed_bps'] or 0:,.0f} bit/s so far)")
    return (f"{alert['kind']} alert: account {alert['account']!r}, billing period {alert['period']}: {what}, at the "
            f"end of hour {alert['hour']:%Y-%m-%d %H:00} UTC (mapping {alert['mapping_version']}, id "
            f"{alert['alert_id']})")


class AlertsNotSent(RuntimeError):
    """Some alerts were not mailed (each logged with its reason); the others were, and are recorded."""


class AlertNotifier(BaseNotifier):
    """Mails each alert through an SMTP connection when one is configured (and recipients given), else logs it.

    ``on_sent(alert_id)`` is called after each alert is sent (or logged).
    """

    template_fields = ()  # alerts carry account names from the accounts file: data, not templates

    def __init__(self, alerts: Iterable[dict], smtp_conn_id: str = "smtp_default", to: Iterable[str] = (),
                 from_email: str | None = None, on_sent: Callable[[str], None] | None = None):
        super().__init__()
        self.alerts = list(alerts)
        self.smtp_conn_id = smtp_conn_id
        self.to = tuple(to)
        self.from_email = from_email
        self.on_sent = on_sent or (lambda alert_id: None)
        self.channel = None  # "smtp" or "log", once notified
        self.failed: list[tuple[str, str]] = []  # (alert id, why) of each alert not mailed

    def smtp_configured(self) -> bool:
        """Whether the SMTP connection exists (Airflow's connections: metadata DB, secrets, AIRFLOW_CONN_*)."""
        from airflow.providers.smtp.hooks.smtp import SmtpHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            SmtpHook.get_connection(self.smtp_conn_id)
        except AirflowNotFoundException:
            return False
        return True

    def notify(self, context) -> None:
        if not self.alerts:
            return
        if not self.to or not self.smtp_configured():
            self.channel = "log"
            why = "no alerts_email_to" if not self.to else f"no SMTP connection {self.smtp_conn_id!r}"
            for alert in self.alerts:
                self.log.warning("%s [not mailed: %s]", printable(describe(alert)), why)
                self.on_sent(alert["alert_id"])
            return
        from airflow.providers.smtp.hooks.smtp import SmtpHook

        self.channel = "smtp"
        with SmtpHook(smtp_conn_id=self.smtp_conn_id) as hook:
            sender = self.from_email or hook.from_email or "traffic@localhost"
            for alert in self.alerts:
                self._mail_one(hook, sender, alert)
        if self.failed:
            alert_id, reason = self.failed[0]
            raise AlertsNotSent(f"{len(self.failed)} of {len(self.alerts)} alert(s) not mailed (the next run sends "
                                f"them again); first: {alert_id}: {reason}")

    def _mail_one(self, hook, sender: str, alert: dict) -> None:
        """Mail one alert; a failure is logged and counted, never stops the alerts after it."""
        try:
            # The subject is a mail header: the account's name escaped (a newline in it would end the header).
            hook.send_email_smtp(to=list(self.to), from_email=sender,
                                 subject=f"[traffic] {alert['kind']} alert: {printable(alert['account'])} "
                                         f"({alert['period']})",
                                 html_content=f"<p>{html.escape(describe(alert))}</p>")
        except Exception as error:  # noqa: BLE001 - one alert's mail; the others still go
            reason = printable(f"{type(error).__name__}: {error}")
            self.failed.append((alert["alert_id"], reason))
            self.log.error("not mailed: %s: %s", printable(describe(alert)), reason)
            return
        self.log.info("mailed: %s", printable(describe(alert)))
        self.on_sent(alert["alert_id"])


# -- the record of sent alerts -----------------------------------------------------------------

def sent_path(warehouse) -> Place:
    return warehouse.state_dir() / SENT_FILE


def read_sent(warehouse) -> set[str]:
    """The ids of the alerts already sent."""
    try:
        return set(json.loads(sent_path(warehouse).read_text())["sent"])
    except FileNotFoundError:
        return set()


def _record_sent(warehouse, sent: set[str]) -> None:
    sent_path(warehouse).write_atomic(json.dumps({"sent": sorted(sent)}, indent=1))  # never half a record


@contextmanager
def _one_notifier(warehouse):
    """One notifier at a time per warehouse (a scheduled run beside a backfill); not the warehouse lock, so a
    slow mail server never holds up ingest and close. For a warehouse on object storage, one per host: README,
    not done."""
    with open(warehouse.host_dir() / "alerts-sent.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def notify_pending(settings, context=None) -> dict:
    """Send every stored alert not sent before through ``AlertNotifier``; what was sent, and how."""
    from traffic.accounting.alerts import read_alerts  # deferred: DAG parsing stays light
    from traffic.storage.warehouse import Warehouse  # deferred: DAG parsing stays light

    warehouse = Warehouse.reader(settings)
    if not warehouse.exists():
        return {"sent": [], "channel": None}
    with _one_notifier(warehouse):
        sent = read_sent(warehouse)
        pending = [a for a in read_alerts(warehouse, latest=10**6) if a["alert_id"] not in sent]
        now_sent: list[str] = []

        def record(alert_id: str) -> None:
            sent.add(alert_id)
            now_sent.append(alert_id)
            _record_sent(warehouse, sent)

        notifier = AlertNotifier(pending, settings.alerts_smtp_conn_id, settings.alerts_email_to, on_sent=record)
        try:
            notifier(dict(context or {}))
        finally:  # also when some were not mailed (AlertsNotSent: the task fails, its retry sends them)
            log.info("alerts: %d sent (%s), %d not sent, %d sent before", len(now_sent),
                     notifier.channel or "nothing new", len(notifier.failed), len(sent) - len(now_sent))
    return {"sent": now_sent, "channel": notifier.channel}
