"""The Great Expectations context: one ephemeral context per process, its validation results and Data
Docs stored under ``<warehouse>/_reports``, the suites added to it from their documents, and one
validation definition per (suite, in-memory DataFrame asset). GX is imported here only, when first
needed (``preload`` starts that import in the background while Spark works).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from traffic.quality.one_pass import compile_rules, judging_suite
from traffic.quality.suite_documents import suite_document
from traffic.storage.report_copy import reports_folder
from traffic.storage.warehouse import Warehouse

#: Validation results the Data Docs index lists (the newest; a freeze of one hour makes about four).
#: GX loads every listed result again to rebuild the index after each close, ~4 ms each: with 100 the
#: index alone took ~0.4 s per close once a month of history was kept. Older pages stay, linked from
#: the traffic report's quality section.
DOCS_INDEX_RUNS = 24


def reports_dir(warehouse: Warehouse) -> Path:
    """``<warehouse>/_reports``: the HTML report and Data Docs (not a table). For a warehouse on object storage
    this host's copy, kept in step with the store's (``traffic.storage.report_copy``)."""
    return reports_folder(warehouse)


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


def gx_context(root: Path):
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
        if doc.get("meta", {}).get("engine", "spark") == "spark":  # a row suite: GX judges its one pass
            doc = judging_suite(doc, compile_rules(doc))
        expectations = []
        for item in doc["expectations"]:
            meta = item.get("meta", {})
            severity = "completeness" if meta.get("severity") == "completeness" else (
                "critical" if meta.get("critical") else "warning")
            described = item.get("description") or f"[{severity}] {meta.get('label', item['type'])}"
            expectations.append({**item, "description": described})
        return context.suites.add(gx.ExpectationSuite(name=name, expectations=expectations, meta=doc.get("meta", {})))


def validation_definition(context, suite_name: str, asset_name: str, engine: str):
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
