"""Spark job: freeze closed hours (up to --until), roll up closed days and months, expire.

    spark-submit jobs/close.py --warehouse ./warehouse --until 2026-11-01T10:00:00Z [--only days] [--report FILE] \
        [--set name=value …]

``--report FILE`` writes what the close did (hours frozen, days and months rolled up, hours expired) as
JSON: the hourly DAG's ``close`` task records that, not what it expected.
"""

import sys



def main(argv: list[str]) -> int:
    """Run ``traffic close`` with these arguments in this process's one SparkSession."""
    from traffic.app.cli import main as cli

    return cli(["close", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
