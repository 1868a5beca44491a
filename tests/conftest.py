"""Shared fixtures: one SparkSession for the whole test session (never one per test)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TZ", "UTC")


@pytest.fixture(scope="session")
def spark():
    """``local[2]``, few shuffle partitions, UI off — built by the project's own builder."""
    from traffic.settings import load_settings
    from traffic.spark import build_spark

    session = build_spark(load_settings(environ={}, overrides={"shuffle_partitions": 2}), "traffic-tests")
    yield session
    session.stop()
