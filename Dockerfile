# One image for every service of the compose stack: Airflow, the Spark master and workers.
# Java for Spark, this project installed from requirements.lock, and Delta Lake's jars baked
# in at build time so the Delta layer's `spark` engine is used (TRAFFIC_ENGINE=auto finds them).
FROM python:3.11-slim-bookworm

ARG DELTA_VERSION=4.4.1
ARG SCALA_VERSION=2.13
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
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless curl tini procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/traffic
COPY requirements.lock pyproject.toml README.md ./
RUN pip install -r requirements.lock "psycopg2-binary>=2.9"
COPY traffic ./traffic
COPY schemas ./schemas
COPY expectations ./expectations
COPY jobs ./jobs
COPY dags ./dags
RUN pip install --no-deps --no-build-isolation -e .

RUN mkdir -p /opt/delta-jars \
 && curl -fsSL -o /opt/delta-jars/delta-spark_${SCALA_VERSION}-${DELTA_VERSION}.jar \
      ${MAVEN}/io/delta/delta-spark_${SCALA_VERSION}/${DELTA_VERSION}/delta-spark_${SCALA_VERSION}-${DELTA_VERSION}.jar \
 && curl -fsSL -o /opt/delta-jars/delta-storage-${DELTA_VERSION}.jar \
      ${MAVEN}/io/delta/delta-storage/${DELTA_VERSION}/delta-storage-${DELTA_VERSION}.jar

# spark-class and spark-submit come with the pyspark package.
RUN ln -s "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" /opt/spark
ENV SPARK_HOME=/opt/spark PATH=/opt/spark/bin:$PATH PYSPARK_PYTHON=python

RUN useradd --create-home --uid 50000 traffic && mkdir -p /data /opt/airflow && chown -R traffic /data /opt/airflow
USER traffic
ENTRYPOINT ["/usr/bin/tini", "--"]
