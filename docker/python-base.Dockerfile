# A stand-in for python:3.11-slim-bookworm, built from Debian's packages where no image registry
# is reachable (scripts/local-images.sh). Debian's Python 3.11 in a venv at /opt/python, first on
# PATH, so `python` and `pip` behave as in the official image (pip installs as root, no PEP 668;
# setuptools and wheel are there, as in the official image, for builds without isolation).
# It trusts the certificate authorities of the host that built it (host-ca-certificates.crt, which
# local-images.sh copies in): pip reaches PyPI through the same network, proxies included.
ARG DEBIAN_IMAGE=traffic-debian:bookworm
FROM ${DEBIAN_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 PYTHONUNBUFFERED=1 \
    PIP_CERT=/etc/ssl/certs/host-ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/host-ca-certificates.crt
COPY host-ca-certificates.crt /etc/ssl/certs/host-ca-certificates.crt
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/python \
 && /opt/python/bin/pip install --no-cache-dir pip==26.3 setuptools==84.2.1 wheel==0.48.0
ENV VIRTUAL_ENV=/opt/python PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]
