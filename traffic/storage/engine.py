"""Which Delta engine writes the tables, and why (DESIGN §8): decided from the settings alone.

Kept apart from the warehouse's door so that what starts Spark (``traffic.runtime.spark``) and what
logs the choice can ask without sitting above the tables.
"""

from __future__ import annotations

from traffic.core.location import is_object_url
from traffic.core.settings import Settings, delta_classpath, s3a_classpath


def choose_engine(settings: Settings) -> str:
    """``rs`` or ``spark``: ``auto`` picks ``spark`` where Delta's jars are in ``spark_jars_dir`` (for a warehouse
    on object storage, with Hadoop's S3A connector among them)."""
    if settings.engine != "auto":
        return settings.engine
    if is_object_url(str(settings.warehouse)):
        return "spark" if s3a_classpath(settings.spark_jars_dir) else "rs"
    return "spark" if delta_classpath(settings.spark_jars_dir) else "rs"


def engine_reason(settings: Settings) -> str:
    """One line: which engine writes the tables, and why."""
    engine = choose_engine(settings)
    if settings.engine != "auto":
        return f"{engine} (engine = {settings.engine})"
    if engine == "spark":
        return f"spark (delta-spark, Delta's jars in {settings.spark_jars_dir})"
    if is_object_url(str(settings.warehouse)) and delta_classpath(settings.spark_jars_dir):
        return f"rs (delta-rs: no S3A connector (hadoop-aws) beside Delta's jars in {settings.spark_jars_dir})"
    return f"rs (delta-rs: no Delta jars in {settings.spark_jars_dir or 'spark_jars_dir (not set)'})"


def writes_need_spark(settings: Settings) -> bool:
    """Whether writing a table takes a SparkSession (the spark engine); delta-rs commits without one."""
    return choose_engine(settings) == "spark"
