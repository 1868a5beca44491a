"""Spark job: import archived files for a time range (or restate a frozen range), then close — one application.

    spark-submit jobs/replay.py --from 2026-10-01T00:00Z --to 2026-11-01T00:00Z --input /archive \
        [--source edge-a] [--restate --reason "router clock fix"] [--warehouse ./warehouse]
"""

import sys


def main(argv: list[str]) -> int:
    """Run ``traffic replay`` with these arguments in this process's one SparkSession."""
    from traffic.app.cli import main as cli

    return cli(["replay", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
