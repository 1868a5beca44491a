"""Operator acceptance: a failed period accepted by a person, with who, when and why (``traffic accept``)."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from traffic.core.periods import month_start
from traffic.quality.suite_documents import Outcome, period_label
from traffic.storage import state as st
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc


class AcceptError(ValueError):
    """A period cannot be accepted as asked; the message says why."""


def parse_period(text: str) -> tuple[str, datetime]:
    """``2026-11`` (month), ``2026-11-01`` (day) or an ISO hour (``2026-11-01T10``, ``…T10:00Z``) → (grain, start)."""
    value = text.strip()
    try:
        if len(value) == 7:
            return "month", datetime.strptime(value, "%Y-%m").replace(tzinfo=UTC)
        if len(value) == 10:
            return "day", datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC)
        if len(value) == 13:
            return "hour", datetime.strptime(value, "%Y-%m-%dT%H").replace(tzinfo=UTC)
        start = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise AcceptError(f"--period {text!r}: expected a month (2026-11), a day (2026-11-01) or an hour "
                          "(2026-11-01T10:00Z)") from None
    start = start.replace(tzinfo=UTC) if start.tzinfo is None else start.astimezone(UTC)
    if start.minute or start.second or start.microsecond:
        raise AcceptError(f"--period {text!r}: an hour starts on the hour")
    return "hour", start


def accept(settings, period: str, reason: str, by: str, now: datetime | None = None, spark=None) -> dict:
    """An operator accepts a failed period: ``dq_status = accepted``, with who, when and why (audited).

    ``spark`` (a session, or a function that starts one) writes where the tables' engine needs it.

    The ledger row keeps its ``dq_note`` (why it failed); ``dq_results`` gets an ``accepted`` row.
    Roll-ups over the period proceed at the next close.
    """

    if not (reason or "").strip():
        raise AcceptError("accept needs --reason (it is kept in the ledger)")
    grain, start = parse_period(period)
    warehouse = Warehouse(settings, spark=spark)
    if not warehouse.exists():
        raise AcceptError(f"no warehouse at {settings.warehouse}")
    with warehouse.lock("traffic accept"):
        rows = st.read_ledger(warehouse, grain, keys=[month_start(start)])
        row = next((r for r in rows if r["period_start"] == start), None)
        label = f"{grain} {period_label(grain, start)}"
        if row is None:
            raise AcceptError(f"{label} is not closed (no ledger row): nothing to accept")
        if row["dq_status"] != "failed":
            raise AcceptError(f"{label} is {row['dq_status']}: only a failed period can be accepted")
        when = now or datetime.now(UTC)
        accepted = {**row, "dq_status": "accepted", "accepted_by": by, "accepted_at": when,
                    "accepted_reason": reason.strip()}
        table = warehouse.table("dq_results")
        run_id = f"accept-{period_label(grain, start).replace(':', '').replace('-', '')}-{when:%Y%m%dT%H%M%SZ}"
        entry = Outcome("periods", grain, start, "operator", f"accepted by {by}", True,
                        f"{reason.strip()} (was failed: {row.get('dq_note') or 'no note'})"[:1000], False, run_id)
        table.append(pa.Table.from_pylist([entry.row()], schema=table.arrow_schema), op="accept")
        st.write_ledger_rows(warehouse, [accepted], op="accept")
    return accepted
