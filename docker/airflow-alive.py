"""The compose stack's health check of an Airflow component: ``airflow jobs check --job-type TYPE --local``
asked of the metadata database directly.

Airflow's own command imports all of Airflow, 2-3 s of CPU a check; three services checking every 30 s
kept about a third of a core busy on an idle stack, on a machine of two. The question is the same: is
exactly one job of TYPE on this host running, with a heartbeat within the threshold (Airflow's default
for the scheduler, the triggerer and the DAG processor: 30 s)? Exit 0 if so, else 1 and why, on one line.

    python /usr/local/bin/airflow-alive.py SchedulerJob [THRESHOLD_SECONDS]
"""

from __future__ import annotations

import os
import socket
import sys

THRESHOLD = 30.0


def hostname() -> str:
    """The name a job records for this host: Airflow's default ``hostname_callable`` (``airflow.utils.net.getfqdn``)."""
    name = socket.gethostname()
    try:
        found = socket.getaddrinfo(name, None, 0, socket.SOCK_DGRAM, 0, socket.AI_CANONNAME)
    except OSError:
        return name
    return next((canonical for *_, canonical, _ in found if canonical), name)


def alive_jobs(url: str, job_type: str, host: str, threshold: float) -> int:
    import psycopg2  # deferred: the tests import this module for hostname() without a database

    connection = psycopg2.connect(url, connect_timeout=5)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM job WHERE job_type = %s AND state = 'running' AND hostname = %s"
                           " AND latest_heartbeat > now() - make_interval(secs => %s)", (job_type, host, threshold))
            return cursor.fetchone()[0]
    finally:
        connection.close()


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: airflow-alive.py JOB_TYPE [THRESHOLD_SECONDS]", file=sys.stderr)
        return 2
    job_type, threshold = argv[1], float(argv[2]) if len(argv) == 3 else THRESHOLD
    url = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("postgresql+psycopg2://", "postgresql://", 1)
    host = hostname()
    try:
        count = alive_jobs(url, job_type, host, threshold)
    except Exception as error:  # noqa: BLE001 - a health check says why it failed, on one line
        print(f"{job_type} on {host}: the metadata database did not answer: {str(error).strip().splitlines()[0]}")
        return 1
    if count != 1:
        print(f"{job_type} on {host}: {count} running jobs with a heartbeat in the last {threshold:g} s, not 1")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
