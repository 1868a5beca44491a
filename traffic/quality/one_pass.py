"""Every expectation of a row suite over every row of its periods, in one pass (DESIGN §6a).

A row suite (``packets``, ``hourly``, ``panes``, …: ``meta.engine = "spark"``) is compiled once per
process into ``Rule``s, each a Spark condition that is true exactly for the rows Great Expectations
would count as unexpected (its map metrics' semantics: a null is "missing", not unexpected, except for
``not_be_null``). ``measure`` then reads a period's rows in one aggregation, grouped by period, that yields for each
rule and period the rows breaking it and, for a range rule, the smallest and largest value among
them. A suite with a key (``expect_compound_columns_to_be_unique``) also has its uniqueness counted as
"rows = distinct keys", exactly and without a window function: keys are hashed and grouped, and only
rows whose hash repeats are grouped again by the key itself (``_duplicated``). One aggregation of
both kinds was measured slower (6.3–6.9 s against 4.5 s for 1.35 M hourly rows): it carries every
rule's sums through the grouping by key. Example rows are read only for a rule that failed
(``examples``), a few per period.

GX still judges: ``judged_frame`` turns the pass into one small table (a row per period, a verdict per rule) that
``suites.Validation`` validates with a suite of standard expectations built from the original, one per
rule, so Data Docs list every expectation with its label, its observed count and, when it fails, the
example rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from traffic.quality.suite_documents import as_period, period_label

#: Example rows read per failed rule and period (Data Docs, ``dq_results``' text).
EXAMPLES = 5
#: The kwargs each expectation type may carry here; anything else is refused by name, not guessed.
_KWARGS = {
    "expect_column_values_to_not_be_null": {"column"},
    "expect_column_values_to_be_between": {"column", "min_value", "max_value", "strict_min", "strict_max"},
    "expect_column_values_to_be_in_set": {"column", "value_set"},
    "expect_column_values_to_match_regex": {"column", "regex"},
    "expect_compound_columns_to_be_unique": {"column_list", "ignore_row_if"},
}


class UnsupportedRule(ValueError):
    """An expectation the one pass cannot evaluate (its suite must say something else)."""


@dataclass(frozen=True)
class Rule:
    """One expectation of a row suite: its place, GX type and arguments, and the label people read."""

    index: int
    kind: str
    kwargs: dict
    meta: dict
    description: str = ""

    @property
    def key(self) -> str:
        return f"r{self.index:02d}"

    @property
    def name(self) -> str:
        """How ``dq_results`` and messages name it: ``type(label)``."""
        return f"{self.kind}({self.meta.get('label', '')})"

    @property
    def verdict_column(self) -> str:
        """Its column in the table GX judges (``judged_frame``): its label, which Data Docs title its section
        with, and its place in the suite (labels need not be unique)."""
        return f"{self.meta.get('label') or self.kind} [{self.key}]"

    @property
    def column(self) -> str | None:
        return self.kwargs.get("column")

    @property
    def unique(self) -> bool:
        return self.kind == "expect_compound_columns_to_be_unique"

    def broken(self):
        """A Spark condition, never null, true for a row GX counts as unexpected (row rules only).

        Built once per process and kind of session (classic or Connect): every close asks for each rule's
        condition, and building it through py4j cost about a second of each small close.
        """
        mode = _session_kind()
        built = self.__dict__.get("_broken")
        if built is None or built[0] != mode:
            built = (mode, self._condition())
            object.__setattr__(self, "_broken", built)  # a cache beside the frozen fields, not one of them
        return built[1]

    def _condition(self):
        from pyspark.sql import functions as F

        value = F.col(self.column)
        if self.kind == "expect_column_values_to_not_be_null":
            return value.isNull()
        if self.kind == "expect_column_values_to_be_between":
            low, high = self.kwargs.get("min_value"), self.kwargs.get("max_value")
            out = F.lit(False)
            if low is not None:
                out = out | ((value <= F.lit(low)) if self.kwargs.get("strict_min") else (value < F.lit(low)))
            if high is not None:
                out = out | ((value >= F.lit(high)) if self.kwargs.get("strict_max") else (value > F.lit(high)))
        elif self.kind == "expect_column_values_to_be_in_set":
            out = ~value.isin(list(self.kwargs["value_set"]))
        else:  # expect_column_values_to_match_regex (GX's Spark engine: rlike, a search)
            out = ~value.rlike(self.kwargs["regex"])
        return value.isNotNull() & out


def _session_kind():
    """What a Spark condition built now belongs to: Connect's client-side expressions, or the JVM behind the
    classic session's gateway."""
    from pyspark.sql.utils import is_remote

    if is_remote():
        return "connect"
    from pyspark import SparkContext

    return "classic", id(SparkContext._gateway)


def compile_rules(doc: dict) -> list[Rule]:
    """A row suite's expectations as rules; an expectation the pass cannot evaluate is refused in one line."""
    rules = []
    for index, item in enumerate(doc["expectations"]):
        kind, kwargs = item["type"], dict(item.get("kwargs", {}))
        allowed = _KWARGS.get(kind)
        where = f"suite {doc.get('name', '?')!r}, expectation {index} ({kind})"
        if allowed is None:
            raise UnsupportedRule(f"{where}: not one the one-pass checks evaluate ({', '.join(sorted(_KWARGS))})")
        extra = set(kwargs) - allowed
        if extra:
            raise UnsupportedRule(f"{where}: argument(s) {sorted(extra)} not supported by the one-pass checks")
        if kind == "expect_column_values_to_be_between" and kwargs.get("min_value") is None \
                and kwargs.get("max_value") is None:
            raise UnsupportedRule(f"{where}: needs min_value or max_value")
        if any(isinstance(v, dict) for v in kwargs.values()):
            raise UnsupportedRule(f"{where}: parameters ($PARAMETER) are not supported by the one-pass checks")
        rules.append(Rule(index, kind, kwargs, item.get("meta", {}), item.get("description", "")))
    if sum(r.unique for r in rules) > 1:
        raise UnsupportedRule(f"suite {doc.get('name', '?')!r}: at most one key (compound uniqueness) per suite")
    return rules


@dataclass
class Measured:
    """What one pass saw, per period: rows, and per rule the rows that broke it (and their range)."""

    rows: dict[datetime, int] = field(default_factory=dict)
    broken: dict[tuple[str, datetime], int] = field(default_factory=dict)
    low: dict[tuple[str, datetime], Any] = field(default_factory=dict)
    high: dict[tuple[str, datetime], Any] = field(default_factory=dict)

    def failed(self) -> dict[str, list[datetime]]:
        """Rule key -> the periods it failed for."""
        out: dict[str, list[datetime]] = {}
        for (key, period), count in self.broken.items():
            if count:
                out.setdefault(key, []).append(period)
        return out


def measure(frame, rules: list[Rule], period_column: str) -> Measured:
    """For each period of ``frame`` its rows and, per rule, the rows breaking it (``measure_together`` of one)."""
    return measure_together([(frame, rules, period_column)])[0]


def measure_together(items: list[tuple[Any, list[Rule], str]]) -> list[Measured]:
    """``measure`` of several (frame, rules, period column) at once: every frame's pass in one Spark job.

    Each frame contributes, per period, its rows and the rows breaking *any* of its row rules (one
    condition, one sum: the narrow aggregation Spark compiles and runs fastest) and, for a suite with
    a key, the number of key hashes seen more than once. The branches are unioned and collected
    together, so a freeze pays Spark's fixed cost of a job once for all its suites. Only a period
    where some row broke a rule is read again, to count each rule's breaking rows there; a repeated hash
    (a duplicate, or a collision) is settled exactly by ``_duplicated``; the breaking range of a failed
    range rule is read last. A clean freeze is therefore one job, however many rules its suites hold.
    """
    from pyspark.sql import functions as F

    measured = [Measured() for _ in items]
    row_rules = [[r for r in rules if not r.unique] for _, rules, _ in items]
    keys = {i: next((r for r in rules if r.unique), None) for i, (_, rules, _) in enumerate(items)}
    suspects: set[int] = set()
    dirty: dict[int, list[datetime]] = {}
    first = _together(dict(enumerate(items)), lambda i: [F.count(F.lit(1)), F.count_if(_any([F.lit(False)] + [
        r.broken() for r in row_rules[i]]))], keys)
    for row in first:
        i = row["_item"]
        if row["_key"]:
            if row["_counts"][0]:
                suspects.add(i)
            continue
        at, (rows, broken) = as_period(row["_period"]), row["_counts"]
        measured[i].rows[at] = int(rows)
        measured[i].broken.update({(r.key, at): 0 for r in row_rules[i]})
        if broken:
            dirty.setdefault(i, []).append(at)
    narrowed = {i: (items[i][0].where(F.col(items[i][2]).isin(periods)), items[i][1], items[i][2])
                for i, periods in dirty.items()}
    for row in _together(narrowed, lambda i: [F.count_if(r.broken()) for r in row_rules[i]], {}):
        at = as_period(row["_period"])
        for r, count in zip(row_rules[row["_item"]], row["_counts"]):
            measured[row["_item"]].broken[(r.key, at)] = int(count or 0)
    for i, (frame, rules, column) in enumerate(items):
        if keys[i] is not None:
            duplicated = _duplicated(frame, keys[i], column) if i in suspects else {}
            for at in measured[i].rows:
                measured[i].broken[(keys[i].key, at)] = duplicated.get(at, 0)
        _breaking_ranges(frame, [r for r in rules if r.kind == "expect_column_values_to_be_between"], measured[i],
                         column)
    return measured


def _together(items: dict[int, tuple[Any, list[Rule], str]], aggregates, keys: dict[int, Rule | None]) -> list:
    """One collect of the union of every item's ``aggregates(i)`` grouped by its period (``_counts``, an array
    of longs) and, for an item with a key in ``keys``, a row counting the key hashes seen more than once."""
    from pyspark.sql import functions as F

    by_type: dict[str, list[int]] = {}
    for i, (frame, _, column) in items.items():
        by_type.setdefault(frame.schema[column].dataType.simpleString(), []).append(i)
    rows = []
    for group in by_type.values():  # a union needs one period type (in practice there is one group)
        branches = []
        for i in group:
            frame, _, column = items[i]
            branches.append(frame.groupBy(F.col(column).alias("_period"))
                            .agg(F.array(*[c.cast("long") for c in aggregates(i)]).alias("_counts"))
                            .select(F.lit(i).alias("_item"), F.lit(False).alias("_key"), "_period", "_counts"))
            if keys.get(i) is not None:
                repeated = (_hashed(frame, keys[i]).groupBy("_h").agg(F.count(F.lit(1)).alias("_n"))
                            .where(F.col("_n") > 1).agg(F.count(F.lit(1)).alias("_repeated")))
                branches.append(repeated.select(F.lit(i).alias("_item"), F.lit(True).alias("_key"),
                                                F.lit(None).cast(frame.schema[column].dataType).alias("_period"),
                                                F.array(F.col("_repeated").cast("long")).alias("_counts")))
        union = branches[0]
        for branch in branches[1:]:
            union = union.unionByName(branch)
        rows += union.collect()
    return rows


def _breaking_ranges(frame, ranged: list[Rule], measured: Measured, period_column: str) -> None:
    """The smallest and largest breaking value of each range rule that failed, per period (read only when
    one did: the pass itself carries counts alone)."""
    from pyspark.sql import functions as F

    failed = measured.failed()
    ranged = [r for r in ranged if r.key in failed]
    if not ranged:
        return
    aggregates = []
    for r in ranged:
        value = F.when(r.broken(), F.col(r.column))
        aggregates += [F.min(value).alias(f"{r.key}_low"), F.max(value).alias(f"{r.key}_high")]
    periods = sorted({p for r in ranged for p in failed[r.key]})
    for row in (frame.where(F.col(period_column).isin(periods)).groupBy(F.col(period_column).alias("_period"))
                .agg(*aggregates).collect()):
        at = as_period(row["_period"])
        for r in ranged:
            measured.low[(r.key, at)], measured.high[(r.key, at)] = row[f"{r.key}_low"], row[f"{r.key}_high"]


def _duplicated(frame, unique: Rule, period_column: str) -> dict[datetime, int]:
    """Per period, the rows whose key is seen more than once (GX's unexpected rows of a compound uniqueness):
    rows = distinct keys, exactly, without a window function.

    Every row's key is hashed (64 bits) and the hashes grouped: a hash seen once is a key seen once, so
    where no hash repeats the key is unique, proven. Only rows whose hash repeats (a duplicate, or two keys
    that collide) are grouped again by the key itself, across periods, each row attributed to its own.
    """
    from pyspark.sql import functions as F

    columns = list(unique.kwargs["column_list"])
    counted = _hashed(frame, unique)
    repeated = [row["_h"] for row in counted.groupBy("_h").agg(F.count(F.lit(1)).alias("_n"))
                .where(F.col("_n") > 1).select("_h").collect()]
    if not repeated:
        return {}
    suspects = counted.where(F.col("_h").isin(repeated))
    keys = [F.col(c).alias(f"_k{i}") for i, c in enumerate(columns)]
    seen = suspects.groupBy(*keys).agg(F.count(F.lit(1)).alias("_n")).where(F.col("_n") > 1)
    rows = suspects.select(F.col(period_column).alias("_period"), *keys)
    joined = rows.join(seen, on=[rows[f"_k{i}"].eqNullSafe(seen[f"_k{i}"]) for i in range(len(columns))])
    return {as_period(row["_period"]): int(row["_rows"])
            for row in joined.groupBy("_period").agg(F.count(F.lit(1)).alias("_rows")).collect()}


def _hashed(frame, unique: Rule):
    """The rows a uniqueness rule counts, each with its key's 64-bit hash (``_h``)."""
    from pyspark.sql import functions as F

    return frame.where(~_skipped(unique)).withColumn(
        "_h", F.xxhash64(*[F.col(c) for c in unique.kwargs["column_list"]]))


def _skipped(unique: Rule):
    """Rows a uniqueness rule ignores (GX's ``ignore_row_if``; by default rows whose key is all null)."""
    from pyspark.sql import functions as F

    missing = [F.col(c).isNull() for c in unique.kwargs["column_list"]]
    ignore = unique.kwargs.get("ignore_row_if", "all_values_are_missing")
    if ignore == "all_values_are_missing":
        return _all(missing)
    if ignore == "any_value_is_missing":
        return _any(missing)
    return F.lit(False)


def _all(conditions):
    out = conditions[0]
    for c in conditions[1:]:
        out = out & c
    return out


def _any(conditions):
    out = conditions[0]
    for c in conditions[1:]:
        out = out | c
    return out


def examples(frame, rule: Rule, periods: list[datetime], period_column: str, limit: int = EXAMPLES) -> dict:
    """A few rows breaking ``rule`` in each of ``periods`` (read only for a rule that failed)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if rule.unique:  # rows of keys seen more than once
        columns = list(rule.kwargs["column_list"])
        kept = frame.where(~_skipped(rule))
        seen = kept.groupBy(*columns).agg(F.count(F.lit(1)).alias("rows_with_key")).where(F.col("rows_with_key") > 1)
        rows = kept.select(F.col(period_column).alias("_period"), *columns).join(seen, on=columns)
    else:
        rows = frame.where(rule.broken()).withColumn("_period", F.col(period_column))
    rows = rows.where(F.col("_period").isin(periods))
    ranked = rows.withColumn("_n", F.row_number().over(Window.partitionBy("_period").orderBy(F.lit(1))))
    found: dict[datetime, list[dict]] = {}
    for row in ranked.where(F.col("_n") <= limit).drop("_n").collect():
        values = row.asDict()
        found.setdefault(as_period(values.pop("_period")), []).append(values)
    return found


def observed(rule: Rule, measured: Measured, period: datetime, rows: list[dict]) -> str:
    """What ``dq_results`` says a failed rule saw in a period: ``1 row, min -40``, ``2 rows share a key: …``."""
    count = measured.broken[(rule.key, period)]
    head = f"{count:,} row{'s' if count != 1 else ''}"
    if rule.unique:
        keys = _distinct([tuple(_plain(r.get(c)) for c in rule.kwargs["column_list"]) for r in rows])
        return f"{head} share a key: " + ", ".join("(" + ", ".join(map(str, k)) + ")" for k in keys[:3])
    if rule.kind == "expect_column_values_to_not_be_null":
        return f"{head} null"
    if rule.kind == "expect_column_values_to_be_between":
        low, high = _plain(measured.low.get((rule.key, period))), _plain(measured.high.get((rule.key, period)))
        if low is not None:
            return f"{head}, min {low}" + (f", max {high}" if high != low else "")
    values = _distinct([_plain(r.get(rule.column)) for r in rows])
    return f"{head}: {', '.join(repr(v) for v in values[:3])}"


def judged_frame(rules: list[Rule], measured: Measured, found: dict, grain: str):
    """The pass as a small pandas table GX validates: a row per period, its rows, and per rule its verdict
    there — ``ok``, or the period, what the rule saw and a few example rows."""
    import pandas as pd

    records = []
    for period in sorted(measured.rows):
        label = period_label(grain, period)
        record = {"period": label, "rows": measured.rows[period]}
        for rule in rules:
            verdict = "ok"
            if measured.broken[(rule.key, period)]:
                shown = found.get((rule.key, period), [])
                verdict = f"{label}: {observed(rule, measured, period, shown)}"
                if shown:
                    verdict += "; e.g. " + " | ".join(_row_text(r) for r in shown[:3])
            record[rule.verdict_column] = verdict
        records.append(record)
    return pd.DataFrame.from_records(records, columns=["period", "rows", *[r.verdict_column for r in rules]])


def _row_text(row: dict, width: int = 400) -> str:
    """An example row as ``column=value, …`` (nulls left out), cut at ``width`` characters."""
    text = ", ".join(f"{k}={_plain(v)}" for k, v in row.items() if v is not None and not k.startswith("_"))
    return text if len(text) <= width else text[:width - 1] + "…"


def judging_suite(doc: dict, rules: list[Rule]) -> dict:
    """The suite GX runs over ``judged_frame``: per rule, every period's verdict is ``ok``. Each carries the
    rule's label, severity and definition; a failed one lists the periods, what it saw and example rows."""
    expectations = []
    for rule in rules:
        severity = "completeness" if rule.meta.get("severity") == "completeness" else (
            "critical" if rule.meta.get("critical") else "warning")
        definition = json.dumps({"type": rule.kind, "kwargs": rule.kwargs}, default=str)
        expectations.append({
            "type": "expect_column_values_to_be_in_set",
            "kwargs": {"column": rule.verdict_column, "value_set": ["ok"]},
            "meta": {**rule.meta, "rule": rule.key, "rule_type": rule.kind, "definition": definition},
            "description": f"[{severity}] {rule.meta.get('label', rule.kind)} — {rule.kind}, over every row; "
                           "one verdict per period",
        })
    return {"name": doc["name"], "meta": {**doc.get("meta", {}), "one_pass": True}, "expectations": expectations}


def _distinct(values: list) -> list:
    seen, out = set(), []
    for v in values:
        if repr(v) not in seen:
            seen.add(repr(v))
            out.append(v)
    return out


def _plain(value):
    """Plain Python values for messages (timestamps to the second, whole floats as integers)."""
    if isinstance(value, datetime):
        return as_period(value).strftime("%Y-%m-%dT%H:%M:%S")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
