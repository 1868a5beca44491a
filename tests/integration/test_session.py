"""The shared test session is built like a small job's: its JVM runs the quick-starting JIT."""

from __future__ import annotations


def test_the_session_jvm_got_the_quick_start_flags(spark):
    arguments = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in arguments and "-XX:+UseSerialGC" in arguments, arguments
    assert "-XX:ReservedCodeCacheSize=240m" in arguments, arguments  # a long session's code fits
    assert any(a.startswith("-Dlog4j.configurationFile=file:") for a in arguments), arguments
