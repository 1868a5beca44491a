"""Data quality: Great Expectations suites run on what a close produces, before it is published.

``expectations/<suite>.json`` is a Great Expectations 1.x suite, loaded at run time (nothing is
built at import). Each expectation's ``meta`` says whether it is ``critical`` — a failure fails
the period (``dq_status = failed``: not published, nothing rolled up over it, the job exits 3)
— or a warning (published, flagged). ``meta.severity = "completeness"`` follows the
``completeness_action`` setting instead. A suite's ``meta.view`` adds derived columns (Spark SQL
expressions) to the DataFrame it validates, so row rules such as "bytes_in + bytes_out ≤ bytes"
stay plain column expectations. A value written ``{"$records": NAME}`` is ``traffic.core.records.NAME``:
the directions, address form and byte bounds the readers apply, defined once.

One GX run per suite covers every period a step produces (all the hours a close freezes, all
the days it rolls up). A row suite (the Spark tables) is evaluated in one pass over the rows
(``one_pass``: one aggregation yields every rule's breaking rows per period, example rows are read
only for a rule that failed) and GX judges that pass, a verdict per period and rule, so Data Docs show
each expectation with its count and examples. The ledger rows and reconciliation totals are built
on the driver (one row per period) and validated with GX's pandas engine; there the first pass asks
only pass/fail and a second collects the failing rows only if something failed. Every
(expectation, period) lands in ``dq_results``; every run is rendered to GX's Data Docs under
``<warehouse>/_reports/data_docs``; the values a failed run collected are stored (and so rendered)
markup-free, since GX writes them into its pages as raw HTML.

This module runs the suites of one step and decides each period's status; beside it are the suites
as data (``suite_documents``), the GX context (``gx_context``), Data Docs (``data_docs``) and the
operator's acceptance (``acceptance``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Iterable

import pyarrow as pa

from traffic.core.periods import month_start
from traffic.quality import one_pass
from traffic.quality.gx_context import gx_context, reports_dir, validation_definition
from traffic.quality.suite_documents import Outcome, as_period, period_label, suite_document
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc

@dataclass
class Validation:
    """The checks of one close step (freeze, days or months) over all the periods it produces.

    ``run_id`` is derived from the step, its periods and the ledger rows it starts from, so a
    step killed half-way and run again records the same rows (``dq_results`` is replaced per run).
    """

    warehouse: Warehouse
    step: str
    periods: list[tuple[str, datetime]]
    inputs: Iterable[dict] = ()
    outcomes: list[Outcome] = field(default_factory=list)
    identifiers: list[Any] = field(default_factory=list)
    #: (identifier, result) of each run that failed: the values it collected are made markup-free
    #: before Data Docs render it (``build_data_docs``).
    failed_runs: list[tuple[Any, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def __post_init__(self):
        first, last = min(p for _, p in self.periods), max(p for _, p in self.periods)
        grain = self.periods[0][0]
        digest = hashlib.sha1(json.dumps(
            [sorted((g, p.isoformat()) for g, p in self.periods),
             sorted((r["grain"], r["period_start"].isoformat(), r.get("dq_status"), str(r.get("accepted_at")))
                    for r in self.inputs)]).encode()).hexdigest()[:8]
        span = period_label(grain, first).replace(":", "").replace("-", "")
        if last != first:
            span += "-" + period_label(grain, last).replace(":", "").replace("-", "")
        self.run_id = f"{self.step}-{span}-{digest}"
        self.settings = self.warehouse.settings

    # -- running suites -----------------------------------------------------------------------
    def validate(self, suite: str, frame, periods: Iterable[tuple[str, datetime]], asset: str | None = None
                 ) -> list[Outcome]:
        """Run ``suite`` once over ``frame`` and attribute its results to ``periods``.

        A row suite (``meta.engine = "spark"``, a Spark frame) is evaluated in one pass over the rows
        (``one_pass``) and judged by GX from that pass; a ledger suite (a pandas frame built on the
        driver, a row per period) is validated by GX's pandas engine directly.
        """
        return self.validate_together([(suite, frame, periods, asset)])

    def validate_together(self, runs: list[tuple[str, Any, Iterable[tuple[str, datetime]], str | None]]
                          ) -> list[Outcome]:
        """``validate`` of several (suite, frame, periods, asset): the row suites' passes are one Spark job
        (``one_pass.measure_together``), then GX judges each suite on its own (its own Data Docs page)."""
        import time

        clock = time.perf_counter()
        runs = [(suite, frame, list(periods), asset) for suite, frame, periods, asset in runs]
        metas = [suite_document(suite).get("meta", {}) for suite, *_ in runs]
        rows = [i for i, meta in enumerate(metas) if meta.get("engine", "spark") == "spark"]
        frames = {i: _viewed(runs[i][1], metas[i]) for i in rows}
        measured = dict(zip(rows, one_pass.measure_together(
            [(frames[i], suite_rules(runs[i][0]), metas[i]["period_column"]) for i in rows]))) if rows else {}
        outcomes = []
        for i, (suite, frame, periods, asset) in enumerate(runs):
            if i in measured:
                found, result, identifier = self._judge_rows(suite, metas[i], frames[i], measured[i], periods, asset)
            else:
                found, result, identifier = self._validate_ledger(suite, metas[i], frame, periods, asset)
            self.identifiers.append(identifier)
            self.outcomes += found
            outcomes += found
            if not result.success:
                self.failed_runs.append((identifier, result))
        self.seconds += time.perf_counter() - clock
        return outcomes

    def _run(self):
        from great_expectations.core.run_identifier import RunIdentifier

        return RunIdentifier(run_name=self.run_id, run_time=datetime.now(UTC))

    def _judge_rows(self, suite: str, meta: dict, frame, measured, periods: list[tuple[str, datetime]], asset):
        """GX's verdict on a row suite's pass over ``frame`` (``measured``), with example rows of what failed."""
        rules = suite_rules(suite)
        column = meta["period_column"]
        found = {}
        by_key = {r.key: r for r in rules}
        for key, bad in measured.failed().items():
            for period, rows in one_pass.examples(frame, by_key[key], bad, column).items():
                found[(key, period)] = rows
        judged = one_pass.judged_frame(rules, measured, found, meta["grain"])
        context = gx_context(reports_dir(self.warehouse))
        definition = validation_definition(context, suite, asset or f"{suite}.{self.step}", "pandas")
        run = self._run()
        result = definition.run(batch_parameters={"dataframe": judged}, run_id=run, result_format={
            "result_format": "SUMMARY", "partial_unexpected_count": max(20, len(measured.rows)),
            "unexpected_index_column_names": ["period"],
            "return_unexpected_index_query": False})
        identifier = self._identifier(suite, run, result)
        labels = {period_label(meta["grain"], p): p for p in measured.rows}
        wanted = set(periods)
        outcomes = []
        for item in result.results:
            rule = by_key[item.expectation_config.meta["rule"]]
            raised = (item.exception_info or {}).get("raised_exception")
            failed: dict[tuple[str, datetime], str] = {}
            if raised:
                failed = {p: _could_not_run(item) for p in periods}
            elif not item.success:
                entries = (item.result or {}).get("partial_unexpected_index_list") or []
                seen = {(meta["grain"], labels[e["period"]]): one_pass.observed(
                    rule, measured, labels[e["period"]], found.get((rule.key, labels[e["period"]]), [])) for e in entries}
                # Rows outside the periods being checked (should not happen): blame the whole batch.
                failed = seen if set(seen) <= wanted else {p: "; ".join(sorted(set(seen.values()))) for p in periods}
            outcomes += [Outcome(meta["table"], grain, start, suite, rule.name, (grain, start) not in failed,
                                 failed.get((grain, start), "ok"), self._critical(rule.meta), self.run_id)
                         for grain, start in periods]
        return outcomes, result, identifier

    def _validate_ledger(self, suite: str, meta: dict, frame, periods: list[tuple[str, datetime]], asset):
        """A ledger suite over its small pandas frame, in one run that also collects the failing rows.

        The frame has a row per period, so all its failing rows are collected: a close of thousands of hours
        where most fail a check (a source far ahead over a long catch-up) still judges each hour on its own.
        (A first run without them, repeated only on failure, cost a second GX run at every close with a warning.)
        """
        context = gx_context(reports_dir(self.warehouse))
        definition = validation_definition(context, suite, asset or f"{suite}.{self.step}", "pandas")
        index_columns = ["grain", "period_start"] if meta.get("period_column") == "period_start" else \
            [meta["period_column"]]
        detail = {"result_format": "SUMMARY", "partial_unexpected_count": max(20, len(frame)),
                  "unexpected_index_column_names": index_columns, "return_unexpected_index_query": False}
        run = self._run()
        result = definition.run(batch_parameters={"dataframe": frame}, run_id=run, result_format=detail,
                                expectation_parameters={"completeness_min_panes": self.settings.completeness_min_panes})
        identifier = self._identifier(suite, run, result)
        return self._outcomes(suite, meta["table"], meta, periods, result), result, identifier

    @staticmethod
    def _identifier(suite: str, run, result):
        from great_expectations.data_context.types.resource_identifiers import (
            ExpectationSuiteIdentifier,
            ValidationResultIdentifier,
        )

        return ValidationResultIdentifier(expectation_suite_identifier=ExpectationSuiteIdentifier(name=suite),
                                          run_id=run, batch_identifier=result.batch_id)

    def _critical(self, meta: dict) -> bool:
        if meta.get("severity") == "completeness":
            return self.settings.completeness_action == "failure"
        return bool(meta.get("critical"))

    def _outcomes(self, suite: str, table: str, suite_meta: dict, periods: list[tuple[str, datetime]],
                  result) -> list[Outcome]:
        outcomes = []
        for item in result.results:
            config = item.expectation_config
            meta = config.meta or {}
            name = f"{config.type}({meta.get('label', '')})"
            critical = self._critical(meta)
            raised = (item.exception_info or {}).get("raised_exception")
            failed: dict[tuple[str, datetime], str] = {}
            if raised:
                failed = {p: _could_not_run(item) for p in periods}
            elif not item.success:
                failed = _attribute(item.result or {}, config, suite_meta, periods)
            for grain, start in periods:
                why = failed.get((grain, start))
                outcomes.append(Outcome(table, grain, start, suite, name, why is None,
                                        "ok" if why is None else why, critical, self.run_id))
        return outcomes

    # -- decisions ----------------------------------------------------------------------------
    def _not_held(self, grain: str, start: datetime) -> list[Outcome]:
        """The outcomes of one period that did not hold, in order (indexed once per batch of new outcomes:
        a close of a year of hours asks for each of thousands of periods among hundreds of thousands)."""
        index = self.__dict__.get("_index")
        if index is None or index[0] != len(self.outcomes):
            by_period: dict[tuple[str, datetime], list[Outcome]] = {}
            for o in self.outcomes:
                if not o.success:
                    by_period.setdefault((o.grain, o.period_start), []).append(o)
            index = self.__dict__["_index"] = (len(self.outcomes), by_period)
        return index[1].get((grain, start), [])

    def status(self, grain: str, start: datetime) -> tuple[str, str | None]:
        """``passed``/``warning``/``failed`` and a note naming the checks that did not hold."""
        mine = self._not_held(grain, start)
        critical = [o for o in mine if o.critical]
        chosen = critical or mine
        if not chosen:
            return "passed", None
        note = "; ".join(f"{o.suite}: {o.expectation} failed: {o.observed}" for o in chosen)
        return ("failed" if critical else "warning"), note[:1000]

    def failures(self, grain: str, start: datetime) -> list[Outcome]:
        return [o for o in self._not_held(grain, start) if o.critical]

    def message(self, grain: str, start: datetime) -> str:
        """What a person reads when the job fails: ``hour 2026-11-01T10:00Z: <check> failed: <value>``."""
        checks = "; ".join(f"{o.expectation} failed: {o.observed}" for o in self.failures(grain, start))
        return f"{grain} {period_label(grain, start)}: {checks}"

    # -- recording ----------------------------------------------------------------------------
    def record(self) -> None:
        """Write this run's outcomes to ``dq_results`` (replacing an earlier attempt of the same run)."""
        if not self.outcomes:
            return
        table = self.warehouse.table("dq_results")
        keys = sorted({month_start(o.period_start) for o in self.outcomes})
        existing = table.read_arrow(keys=keys)
        import pyarrow.compute as pc

        keep = existing.filter(pc.invert(pc.fill_null(pc.equal(existing.column("run_id"), self.run_id), False)))
        fresh = pa.Table.from_pylist([o.row() for o in self.outcomes], schema=table.arrow_schema)
        table.replace(pa.concat_tables([keep, fresh]), keys=keys, op="quality")


def _viewed(frame, meta: dict):
    """A row suite's frame with the columns its ``meta.view`` derives (Spark SQL), which its rules check."""
    if not meta.get("view"):
        return frame
    return frame.selectExpr("*", *[f"{expr} AS `{name}`" for name, expr in meta["view"].items()])


def _could_not_run(item) -> str:
    message = str((item.exception_info or {}).get("exception_message", "")).strip().splitlines()
    return f"check could not run: {message[0][:200] if message else 'error'}"


@lru_cache(maxsize=None)
def suite_rules(name: str) -> list:
    """A row suite's rules, compiled once per process."""
    return one_pass.compile_rules(suite_document(name))


def _attribute(result: dict, config, suite_meta: dict, periods: list[tuple[str, datetime]]) -> dict:
    """Which periods an expectation failed for, and what it saw there (from the second pass's sample)."""
    sample = result.get("partial_unexpected_index_list") or result.get("unexpected_index_list")
    count = result.get("unexpected_count")
    if sample is None or count is None or count > len(sample):
        text = f"{count:,} rows (not attributed to single periods)" if count is not None else "failed"
        return {p: text for p in periods}
    grain = suite_meta.get("grain")
    column = suite_meta.get("period_column")
    by_period: dict[tuple[str, datetime], list[dict]] = {}
    for entry in sample:
        if column == "period_start":
            key = (entry.get("grain"), as_period(entry.get("period_start")))
        else:
            key = (grain, as_period(entry.get(column)))
        by_period.setdefault(key, []).append(entry)
    if not set(by_period) <= set(periods):
        # Rows outside the periods being checked (should not happen): blame the whole batch.
        return {p: f"{count:,} rows" for p in periods}
    return {p: _describe(config, rows) for p, rows in by_period.items()}


def _describe(config, rows: list[dict]) -> str:
    kwargs = config.kwargs
    n = len(rows)
    head = f"{n} row{'s' if n != 1 else ''}"
    kind = config.type
    if "column" in kwargs:
        values = [_fmt(r.get(kwargs["column"])) for r in rows]
        if kind == "expect_column_values_to_not_be_null":
            return f"{head} null"
        if kind == "expect_column_values_to_be_between":
            numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers:
                low, high = min(numbers), max(numbers)
                return f"{head}, min {_fmt(low)}" + (f", max {_fmt(high)}" if high != low else "")
        return f"{head}: {', '.join(repr(_fmt(v)) for v in _distinct(values)[:3])}"
    if "column_A" in kwargs:
        pairs = _distinct([(_fmt(r.get(kwargs["column_A"])), _fmt(r.get(kwargs["column_B"]))) for r in rows])
        sign = "≠" if "equal" in kind else "<"
        shown = ", ".join(f"{kwargs['column_A']} {_fmt(a)} {sign} {kwargs['column_B']} {_fmt(b)}" for a, b in pairs[:3])
        return f"{head}: {shown}"
    if "column_list" in kwargs:
        keys = _distinct([tuple(_fmt(r.get(c)) for c in kwargs["column_list"]) for r in rows])
        return f"{head} share a key: " + ", ".join("(" + ", ".join(map(str, k)) + ")" for k in keys[:3])
    return head


def _distinct(values: list) -> list:
    seen, result = set(), []
    for v in values:
        key = repr(v)
        if key not in seen:
            seen.add(key)
            result.append(v)
    return result


def _fmt(value):
    """Plain Python values for messages (pandas/numpy scalars, NA, timestamps)."""
    if value is None or value is getattr(__import__("pandas"), "NA", object()):
        return None
    if hasattr(value, "to_pydatetime"):
        value = value.to_pydatetime()
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value
