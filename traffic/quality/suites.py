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
the days it rolls up). The first pass asks only pass/fail, which GX answers with one Spark
aggregation for all column checks; only if something failed does a second pass collect the
failing rows, which name the periods that failed and the values they failed with. The ledger
rows and reconciliation totals are built on the driver (one row per period) and validated with
GX's pandas engine. Every (expectation, period) lands in ``dq_results``; every run is rendered to
GX's Data Docs under ``<warehouse>/_reports/data_docs``; the values a failed run collected are
stored (and so rendered) markup-free, since GX writes them into its pages as raw HTML.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa

from traffic.core import records
from traffic.core.periods import month_start
from traffic.storage.warehouse import Warehouse
from traffic.storage.journal import warehouse_lock
from traffic.storage import state as st

UTC = timezone.utc
SUITE_DIR = Path(__file__).resolve().parents[2] / "expectations"
SUITES = ("packets", "late_packets", "rejects", "hourly", "daily", "monthly", "periods", "panes", "bills", "alerts")
#: Failing rows collected per expectation in the second pass; beyond it, failures are not attributed
#: to single periods and every period of the batch fails (fail closed).
SAMPLE_ROWS = 1000
#: A Spark batch of at most this many rows is collected (Arrow) and validated by GX's pandas engine:
#: same suite, same results, but no Spark job per metric (GX's Spark engine costs ~0.1–0.5 s per
#: expectation even on ten rows). Larger batches are validated where they are, by GX's Spark engine.
DRIVER_ROWS = 200_000
#: Validation results the Data Docs index lists (the newest; a freeze of one hour makes about four).
#: GX loads every listed result again to rebuild the index after each close, ~4 ms each: with 100 the
#: index alone took ~0.4 s per close once a month of history was kept. Older pages stay, linked from
#: the traffic report's quality section.
DOCS_INDEX_RUNS = 24

log = logging.getLogger(__name__)


def reports_dir(warehouse: Warehouse) -> Path:
    """``<warehouse>/_reports``: the HTML report and Data Docs (not a table)."""
    return Path(warehouse.root) / "_reports"


@lru_cache(maxsize=None)
def suite_document(name: str) -> dict:
    """The JSON document of one suite, its ``{"$records": NAME}`` values resolved."""
    path = SUITE_DIR / f"{name}.json"
    if not path.exists():
        raise KeyError(f"no expectation suite {name!r} in {SUITE_DIR}")
    return _resolve_records(json.loads(path.read_text()), name)


def _resolve_records(value, suite: str):
    """``{"$records": NAME}`` → ``traffic.core.records.NAME`` (a tuple as a list), anywhere in a suite document.

    The suites check what the readers produce with the readers' own constants, so the two cannot drift.
    """
    if isinstance(value, dict):
        if set(value) == {"$records"}:
            try:
                found = getattr(records, value["$records"])
            except AttributeError:
                raise KeyError(f"suite {suite!r} names {value['$records']!r}, which traffic.core.records does not "
                               "define") from None
            return list(found) if isinstance(found, tuple) else found
        return {key: _resolve_records(item, suite) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve_records(item, suite) for item in value]
    return value


#: Characters a browser reads as markup, the backslash that writes them, and control characters → ``\xNN``.
_MARKUP = str.maketrans({c: f"\\x{ord(c):02x}" for c in [*"<>&\"'\\", *map(chr, range(32)), "\x7f"]})


def markup_free(value):
    """``value`` with every text in it (through dicts, lists and tuples) free of markup: ``<`` → ``\\x3c``.

    Readable on any page however it is rendered (raw, or escaped again), and never markup.
    """
    if isinstance(value, str):
        return value.translate(_MARKUP)
    if isinstance(value, dict):
        return {markup_free(key): markup_free(item) for key, item in value.items()}
    if isinstance(value, list):
        return [markup_free(item) for item in value]
    if isinstance(value, tuple):
        return tuple(markup_free(item) for item in value)
    return value


def period_label(grain: str, start: datetime) -> str:
    """``2026-11-01T10:00Z``, ``2026-11-01`` or ``2026-11`` (a billing period: its UTC start to the minute)."""
    return {"hour": f"{start:%Y-%m-%dT%H:00Z}", "day": f"{start:%Y-%m-%d}", "month": f"{start:%Y-%m}",
            "bill": f"{start:%Y-%m-%dT%H:%MZ}", "alert": f"{start:%Y-%m-%dT%H:%MZ}"}[grain]


def as_period(value: Any) -> datetime:
    """A period start as aware UTC, from what Spark, pandas or GX hand back (datetime, date, Timestamp, text)."""
    if hasattr(value, "to_pydatetime"):
        value = value.to_pydatetime()
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    raise TypeError(f"not a period start: {value!r}")


@dataclass(frozen=True)
class Outcome:
    """One expectation evaluated for one period (a ``dq_results`` row)."""

    table: str
    grain: str
    period_start: datetime
    suite: str
    expectation: str
    success: bool
    observed: str
    critical: bool
    run_id: str

    def row(self) -> dict:
        return {"table": self.table, "grain": self.grain, "period_start": self.period_start, "suite": self.suite,
                "expectation": self.expectation, "success": self.success, "observed": self.observed,
                "run_id": self.run_id, "critical": self.critical}


# -- the Great Expectations context ------------------------------------------------------------

_CONTEXTS: dict[str, Any] = {}
_PRELOAD: list = []


def preload() -> None:
    """Import Great Expectations in the background (a few seconds of pure Python) while Spark works.

    A close calls this before its first Spark job; by the time it validates, GX is imported.
    """
    if _PRELOAD:
        return
    import threading

    def load():
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        try:
            import great_expectations  # noqa: F401
            import pandas  # noqa: F401
        except Exception:  # noqa: BLE001 - the real import, in the job's thread, reports any error
            pass

    thread = threading.Thread(target=load, name="gx-preload", daemon=True)
    thread.start()
    _PRELOAD.append(thread)


def _context(root: Path):
    """An ephemeral GX context whose validation results and Data Docs live under ``root`` (one per process)."""
    key = str(root)
    if key in _CONTEXTS:
        return _CONTEXTS[key]
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    memory = {"class_name": "InMemoryStoreBackend"}
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        expectations_store_name="expectations_store",
        validation_results_store_name="validation_results_store",
        checkpoint_store_name="checkpoint_store",
        stores={
            "expectations_store": {"class_name": "ExpectationsStore", "store_backend": memory},
            "validation_results_store": {
                "class_name": "ValidationResultsStore",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                                  "base_directory": str(root / "gx" / "validations")},
            },
            "checkpoint_store": {"class_name": "CheckpointStore", "store_backend": memory},
            "validation_definition_store": {"class_name": "ValidationDefinitionStore", "store_backend": memory},
        },
        data_docs_sites={"data_docs": {
            "class_name": "SiteBuilder",
            "show_how_to_buttons": False,
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(root / "data_docs")},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder",
                                   "validation_results_limit": DOCS_INDEX_RUNS},
        }},
    )
    for name in ("great_expectations", "great_expectations.expectations.registry"):
        logging.getLogger(name).setLevel(logging.ERROR)
    context = gx.get_context(mode="ephemeral", project_config=config)
    _CONTEXTS[key] = context
    return context


def _suite(context, name: str):
    import great_expectations as gx

    try:
        return context.suites.get(name)
    except Exception:  # noqa: BLE001 - GX raises its own not-found error type
        doc = suite_document(name)
        expectations = []
        for item in doc["expectations"]:
            meta = item.get("meta", {})
            severity = "completeness" if meta.get("severity") == "completeness" else (
                "critical" if meta.get("critical") else "warning")
            expectations.append({**item, "description": f"[{severity}] {meta.get('label', item['type'])}"})
        return context.suites.add(gx.ExpectationSuite(name=name, expectations=expectations, meta=doc.get("meta", {})))


def _definition(context, suite_name: str, asset_name: str, engine: str):
    """The validation definition of ``suite`` over one in-memory DataFrame asset (created on first use)."""
    import great_expectations as gx

    name = f"{suite_name}@{asset_name}"
    try:
        return context.validation_definitions.get(name)
    except Exception:  # noqa: BLE001
        pass
    source_name = f"traffic-{engine}"
    try:
        source = context.data_sources.get(source_name)
    except Exception:  # noqa: BLE001
        source = (context.data_sources.add_spark(name=source_name, persist=False) if engine == "spark"
                  else context.data_sources.add_pandas(name=source_name))
    try:
        asset = source.get_asset(asset_name)
    except Exception:  # noqa: BLE001
        asset = source.add_dataframe_asset(name=asset_name)
    try:
        batch = asset.get_batch_definition("whole")
    except Exception:  # noqa: BLE001
        batch = asset.add_batch_definition_whole_dataframe("whole")
    return context.validation_definitions.add(
        gx.ValidationDefinition(name=name, data=batch, suite=_suite(context, suite_name)))


# -- one step's validation run -----------------------------------------------------------------

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
    def validate(self, suite: str, frame, periods: Iterable[tuple[str, datetime]], asset: str | None = None,
                 table: str | None = None, rows: int | None = None) -> list[Outcome]:
        """Run ``suite`` once over ``frame`` (Spark, or pandas for the ledger) and attribute results to periods.

        ``rows``: the frame's row count when the caller already knows it (spares a Spark job over it).
        """
        import time

        from great_expectations.core.run_identifier import RunIdentifier

        clock = time.perf_counter()
        doc = suite_document(suite)
        meta = doc.get("meta", {})
        engine = meta.get("engine", "spark")
        if engine == "spark":
            if meta.get("view"):
                frame = frame.selectExpr("*", *[f"{expr} AS `{name}`" for name, expr in meta["view"].items()])
            if (frame.count() if rows is None else rows) <= DRIVER_ROWS:
                frame, engine = _pandas(frame.toArrow()), "pandas"
        context = _context(reports_dir(self.warehouse))
        definition = _definition(context, suite, asset or f"{suite}.{self.step}", engine)
        index_columns = ["grain", "period_start"] if meta.get("period_column") == "period_start" else \
            [meta["period_column"]]
        run = RunIdentifier(run_name=self.run_id, run_time=datetime.now(UTC))
        parameters = {"completeness_min_panes": self.settings.completeness_min_panes}
        result = definition.run(batch_parameters={"dataframe": frame}, expectation_parameters=parameters,
                                result_format="BOOLEAN_ONLY", run_id=run)
        if not result.success:
            # Same run id and batch: this detailed result replaces the first one in the store (and in Data Docs).
            result = definition.run(batch_parameters={"dataframe": frame}, expectation_parameters=parameters,
                                    result_format={"result_format": "SUMMARY", "partial_unexpected_count": SAMPLE_ROWS,
                                                   "unexpected_index_column_names": index_columns,
                                                   "return_unexpected_index_query": False},
                                    run_id=run)
        identifier = self._identifier(suite, run, result)
        self.identifiers.append(identifier)
        outcomes = self._outcomes(suite, table or meta["table"], meta, list(periods), result)
        self.outcomes += outcomes
        if not result.success:
            self.failed_runs.append((identifier, result))
        self.seconds += time.perf_counter() - clock
        return outcomes

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
                message = str((item.exception_info or {}).get("exception_message", "")).strip().splitlines()
                failed = {p: f"check could not run: {message[0][:200] if message else 'error'}" for p in periods}
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


def _store_markup_free(context, identifier, result) -> None:
    """Store a failed run's result again with the values it collected made ``markup_free``.

    GX 1.x escapes the parameters of its text templates but writes table cells (the unexpected
    values and their counts) into Data Docs as raw HTML, so a record value such as
    ``fe80::1%<svg onload=…>`` became live markup. Cleaning the result GX renders from, not the
    rendered page, covers every place GX shows a value, whatever its template; ``dq_results``
    keeps the real values (the outcomes are taken first), and our own pages escape them.
    """
    for item in result.results:
        item.result = markup_free(item.result or {})
        if item.exception_info:
            item.exception_info = markup_free(item.exception_info)
    context.validation_results_store.store_validation_results(
        suite_validation_result=result, suite_validation_result_identifier=identifier,
        expectation_suite_identifier=identifier.expectation_suite_identifier)


def build_data_docs(warehouse: Warehouse, validations: Iterable[Validation]) -> None:
    """Render the runs' validation results (and their suites) into Data Docs; index of the latest runs."""
    validations = list(validations)
    identifiers = [i for v in validations for i in v.identifiers]
    if not identifiers:
        return
    from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

    context = _context(reports_dir(warehouse))
    # Before anything is rendered: should this raise, the close warns and no page is built.
    for validation in validations:
        while validation.failed_runs:  # once each: a second pass would escape the escapes
            _store_markup_free(context, *validation.failed_runs.pop())
    suites = sorted({i.expectation_suite_identifier.name for i in identifiers})
    context.build_data_docs(resource_identifiers=identifiers + [ExpectationSuiteIdentifier(name=s) for s in suites])
    archive_results(reports_dir(warehouse))


def archive_results(root: Path, keep: int = DOCS_INDEX_RUNS) -> int:
    """Move all but the newest ``keep`` validation results from GX's store to ``gx/archive`` (same layout);
    returns how many moved.

    GX rebuilds the Data Docs index by listing every result in its store, so a store holding
    ``dq_retention`` (90 days) of results made every close slower as they piled up. Their pages stay
    in Data Docs, and ``prune_reports`` expires the archive like the store.
    """
    store = root / "gx" / "validations"
    # <suite>/<run name>/<run time>/<batch>.json; run times sort as text (20261122T140233.014627Z).
    results = sorted(store.glob("*/*/*/*.json"), key=lambda p: (p.parts[-2], p.as_posix()))
    moved = results[:-keep] if keep > 0 else results
    for path in moved:
        target = root / "gx" / "archive" / path.relative_to(store)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.replace(target)
        for folder in (path.parent, path.parent.parent):  # the run's folders, once empty
            if folder != store and not any(folder.iterdir()):
                folder.rmdir()
    return len(moved)


def run_periods_end(run_name: str) -> datetime | None:
    """The start of the last period a validation run covered, from its name (``Validation.run_id``):
    ``freeze-20261101T1000Z-20261101T1300Z-1a2b3c4d``, ``days-20261101-…``, ``months-202611-…``."""
    labels = run_name.split("-")[1:-1]
    formats = {14: "%Y%m%dT%H%MZ", 8: "%Y%m%d", 6: "%Y%m"}
    if not labels or len(labels[-1]) not in formats:
        return None
    try:
        return datetime.strptime(labels[-1], formats[len(labels[-1])]).replace(tzinfo=UTC)
    except ValueError:
        return None


def prune_reports(warehouse: Warehouse, before: datetime) -> int:
    """Remove the stored validation results and Data Docs pages of runs whose periods all start before
    ``before`` (what ``dq_retention`` expires from ``dq_results``); returns the runs removed.

    Without this the stores grow by every close forever, and so does the work of listing them
    each time Data Docs and the report are rebuilt. The Data Docs index drops them on its next build.
    """
    import shutil

    root = reports_dir(warehouse)
    removed = set()
    for store in (root / "gx" / "validations", root / "gx" / "archive", root / "data_docs" / "validations"):
        if not store.is_dir():
            continue
        for run in store.glob("*/*"):
            end = run_periods_end(run.name) if run.is_dir() else None
            if end is not None and end < before:
                shutil.rmtree(run)
                removed.add(run.name)
    return len(removed)


def docs_pages(warehouse: Warehouse) -> dict[tuple[str, str], dict[str, str]]:
    """(suite, run_id) → {asset: newest Data Docs page}, paths relative to ``_reports`` (for the report).

    Pages live at ``data_docs/validations/<suite>/<run_id>/<run time>/<source>-<asset>.html``; a
    run killed and run again has two run times, and the newest wins.
    """
    base = reports_dir(warehouse) / "data_docs" / "validations"
    pages: dict[tuple[str, str], dict[str, str]] = {}
    if not base.is_dir():
        return pages
    for page in sorted(base.glob("*/*/*/*.html")):
        suite, run_name = page.parts[-4], page.parts[-3]
        asset = page.stem.split("-", 2)[-1] if page.stem.startswith("traffic-") else page.stem
        pages.setdefault((suite, run_name), {})[asset] = page.relative_to(reports_dir(warehouse)).as_posix()
    return pages


# -- failing rows → periods --------------------------------------------------------------------

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


def _pandas(table: pa.Table):
    """Arrow → pandas for GX, integers kept exact.

    An integer column without nulls becomes numpy ``int64``: GX's range checks are vectorised only
    for numpy dtypes and fall back to a Python call per value for nullable ones (0.7 s per 100,000
    rows). A column with nulls keeps pandas' nullable integer dtype (never floats with NaN).
    """
    import pandas as pd

    nullable = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype(), pa.int16(): pd.Int16Dtype(),
                pa.int8(): pd.Int8Dtype(), pa.bool_(): pd.BooleanDtype()}
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_integer(column.type) and column.null_count == 0:
            columns[name] = pd.Series(column.cast(pa.int64()).to_numpy(), name=name)
        else:
            columns[name] = column.to_pandas(types_mapper=nullable.get).rename(name)
    return pd.DataFrame(columns) if columns else table.to_pandas()


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


# -- operator acceptance -----------------------------------------------------------------------

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
    with warehouse_lock(warehouse.state_dir(), settings.lock_timeout.total_seconds(), "traffic accept"):
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
