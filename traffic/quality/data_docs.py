"""Data Docs: GX's pages of every validation run under ``<warehouse>/_reports/data_docs``, the values a
failed run collected stored markup-free first (GX writes them into its pages as raw HTML), the
store's older results archived so its index stays quick, and runs past ``dq_retention`` pruned.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from traffic.quality.gx_context import DOCS_INDEX_RUNS, gx_context, reports_dir
from traffic.quality.suite_documents import markup_free
from traffic.quality.suites import Validation
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc


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

    context = gx_context(reports_dir(warehouse))
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
