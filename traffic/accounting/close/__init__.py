"""Close: freeze closed hours (and raise their alerts), roll up closed days and months, store closed bills, expire
raw detail and, when a retention is set, old per-address rows (DESIGN §3–§6). One module per step:

* ``plan`` — which steps are due (``plan_close``), decided on the driver from the small state tables, so
  a close with nothing to do never starts Spark; the CLI and the hourly DAG both ask it.
* ``freeze`` — closed hours recomputed from raw detail, checked, given ledger rows; the one place alerts are raised.
* ``rollup`` — days from hours, months from days, each re-checking what it is built from.
* ``ledger`` — ledger rows and verdicts, the figures checks compare.
* ``maintenance`` — expiry past each retention, and keeping every table's files and log bounded.
* ``restate`` — a restated range frozen, rolled up and billed again.
* ``execute`` — a run: the plan's steps in order, in one ``CloseResult``.

Each step recomputes its output from its inputs and replaces exactly its partitions before writing the
ledger row that marks it done, so a close killed anywhere and run again ends as an uninterrupted one.

Every step checks what it produces before publishing it (``traffic.quality.suites``: one Great
Expectations run per suite over all the periods of the step). A roll-up first re-checks the
periods it is built from — a frozen hour or a rolled-up day found corrupt since is marked
failed and the roll-up over it waits. The ledger row's ``dq_status`` is the verdict:
``passed``/``warning`` (published) or ``failed`` (not published, until ``traffic accept``).
"""

from traffic.accounting.close.execute import CheckFailed, CloseResult, close_locked, execute_close
from traffic.accounting.close.freeze import (Frozen, freeze_hours, raise_alerts, recompute_arrow, recompute_spark,
                                             spark_rows_differing)
from traffic.accounting.close.maintenance import MAINTAINED, MERGED, VACUUM_EVERY, expire, maintain
from traffic.accounting.close.plan import (PER_ADDRESS_RETENTION, STEPS, ClosePlan, per_address_expiry, plan_close,
                                           restrict)
from traffic.accounting.close.restate import restore_bills, rewrite_restated_periods
from traffic.accounting.close.rollup import roll_up_day, roll_up_days, roll_up_month, roll_up_months

__all__ = ["CheckFailed", "ClosePlan", "CloseResult", "Frozen", "MAINTAINED", "MERGED", "PER_ADDRESS_RETENTION",
           "STEPS", "VACUUM_EVERY", "close_locked", "execute_close", "expire", "freeze_hours", "maintain",
           "per_address_expiry", "plan_close", "raise_alerts", "recompute_arrow", "recompute_spark", "restore_bills",
           "restrict", "rewrite_restated_periods", "roll_up_day", "roll_up_days", "roll_up_month", "roll_up_months",
           "spark_rows_differing"]
