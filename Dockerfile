# One image for every service of the compose stack: Airflow, the Spark master and workers.
# Java for Spark, this project installed from requirements.lock, and Delta Lake's jars baked
# in at build time so the Delta layer's `spark` engine (delta-spark) is used (TRAFFIC_ENGINE=auto
# finds them in TRAFFIC_SPARK_JARS_DIR). The jars are the ones scripts/delta-jars.lock pins, fetched
# from Maven Central ($MAVEN) by scripts/fetch-delta-jars.sh and kept only if their SHA-256 is the
# pinned one: a checksum that differs, or Maven out of reach, fails the build. Every service starts
# through refuse-placeholders.sh, which refuses a setting still holding .env.example's change-me.
# The base is a build argument: the official Python image by default, or (no image registry
# reachable) the one scripts/local-images.sh builds from Debian's packages (TRAFFIC_BASE_IMAGE in .env).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG MAVEN=https://repo1.maven.org/maven2

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GX_ANALYTICS_ENABLED=false \
    TZ=UTC \
    TRAFFIC_SPARK_JARS_DIR=/opt/delta-jars \
    TRAFFIC_ENGINE=auto \
    AIRFLOW_HOME=/opt/airflow

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless ca-certificates curl tini procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/traffic
# Delta's jars first: this layer is rebuilt only when the pins (or the script) change.
COPY scripts/fetch-delta-jars.sh scripts/delta-jars.lock ./scripts/
RUN MAVEN="$MAVEN" sh scripts/fetch-delta-jars.sh --via curl /opt/delta-jars

# The lock alone first: its layer (the slow one) is rebuilt only when the lock changes.
COPY requirements.lock ./
# Airflow on Postgres: psycopg2 for its sync engine and asyncpg for its async one are in the lock.
RUN pip install -r requirements.lock
COPY pyproject.toml README.md ./
COPY traffic ./traffic
COPY schemas ./schemas
COPY expectations ./expectations
COPY jobs ./jobs
COPY dags ./dags
RUN pip install --no-deps --no-build-isolation -e .

COPY scripts/refuse-placeholders.sh /usr/local/bin/
# The Airflow services' health check: `airflow jobs check --local` without importing Airflow (docker/airflow-alive.py).
COPY docker/airflow-alive.py /usr/local/bin/

# spark-class and spark-submit come with the pyspark package.
RUN ln -s "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" /opt/spark
ENV SPARK_HOME=/opt/spark PATH=/opt/spark/bin:$PATH PYSPARK_PYTHON=python

RUN useradd --create-home --uid 50000 traffic && mkdir -p /data /opt/airflow && chown -R traffic /data /opt/airflow
USER traffic
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/refuse-placeholders.sh"]
