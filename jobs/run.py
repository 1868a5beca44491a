"""Spark job: one tick — ingest what is new, then close what the watermark allows.

    spark-submit jobs/run.py --warehouse ./warehouse --inbox ./inbox
"""

import sys



def main(argv: list[str]) -> int:
    """Run ``traffic run`` with these arguments in this process's one SparkSession."""
    from traffic.app.cli import main as cli

    return cli(["run", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
