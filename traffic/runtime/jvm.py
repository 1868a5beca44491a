"""How the Spark driver's JVM starts: a quick-starting JIT for small jobs, the full one for big ones.

A micro-batch or a one-hour close spends most of its time warming the JVM up: HotSpot's optimising
compiler (C2) and the parallel collector burn CPU on code that runs for seconds. With C1 only and
the serial collector, a cold 100 k-packet ``traffic run`` took 25–27 s instead of 34–35 s here and
the JVM used about 40 % less CPU; on 2 M records the same flags were 10–15 % slower, because C2's
code is faster once it is there. So ``spark_jit = auto`` picks the quick JVM unless the job says,
before its JVM starts, that it has big work: the caller that decides it (a batch's size, a close's or
a replay's hours) passes the reason down to where the session is built (``build_spark(big_job=…)``).
Imports nothing heavy (the settings validate ``spark_jit`` against ``core.settings.JIT_MODES``).
"""

from __future__ import annotations

from pathlib import Path

LOG4J = Path(__file__).resolve().parents[1] / "conf" / "log4j2.properties"
#: JIT and collector flags of the quick-starting JVM. With C1 only, HotSpot reserves 48 MB for compiled code
#: (240 MB with both compilers); Spark's generated classes and delta-spark filled that in a long session
#: (`make demo`: "CodeCache is full. Compiler has been disabled" after 32 s, the rest interpreted), so the quick
#: JVM reserves what the full one does: address space, committed only as code is compiled.
QUICK_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"
#: Input above this is big work: a router feed of ~500 k lines, a capture of ~300 k packets.
QUICK_MAX_BYTES = 32 * 1024 * 1024
#: A close that freezes more hours than this is big work (a catch-up or a replay's range).
QUICK_MAX_HOURS = 24

def quick_for(mode: str, big: bool) -> bool:
    """The rule: ``quick`` always, ``full`` never, ``auto`` unless the work is big."""
    return mode == "quick" or (mode == "auto" and not big)


def driver_java_options(quick_start: bool, log4j: Path | str = LOG4J) -> str:
    """``spark.driver.extraJavaOptions``: our log4j2 config, and the quick JIT when asked."""
    options = f"-Dlog4j.configurationFile=file:{log4j}"
    return f"{options} {QUICK_FLAGS}" if quick_start else options
