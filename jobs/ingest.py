"""Spark job: ingest what is new in the inbox (one micro-batch).

    spark-submit jobs/ingest.py --warehouse ./warehouse --inbox ./inbox [--set name=value …]

Takes every setting as an argument (see ``traffic ingest --help``) so Airflow can pass them.
"""

import sys



def main(argv: list[str]) -> int:
    """Run ``traffic ingest`` with these arguments in this process's one SparkSession."""
    from traffic.app.cli import main as cli

    return cli(["ingest", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
