# syntax=docker/dockerfile:1
# The trainfeed image: the `trainfeed` CLI as entrypoint (master, upload, submit, …), and, with
# a framework extra, the base of GPU worker images. Extras are chosen at build time:
#
#   docker build -t trainfeed:0.1.0 .                                        # master, tools
#   docker build -t trainfeed-torch:0.1.0 --build-arg EXTRAS=s3,torch .     # PyTorch workers
#   docker build -t trainfeed-tf:0.1.0 --build-arg EXTRAS=s3,tf \
#       --build-arg EXTRA_PACKAGES='tensorflow[and-cuda]' .                  # TensorFlow workers
#
# Fetched: Python packages through pip, and from the base image's own Debian archive only what
# the JPEG region decoder needs (a compiler and libjpeg-turbo's headers to build it, the library
# to run it). No curl, no other sources. See docs/cluster.md.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: the trainfeed wheel alone (its dependencies install from PyPI below) ---------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The region decoder (trainfeed/decode/_jpeg_region.c) is compiled against libjpeg-turbo.
# Versions are whatever the base image's Debian release carries (security updates included).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libjpeg62-turbo-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY trainfeed ./trainfeed
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- runtime ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# Comma-separated extras of pyproject.toml: s3, etcd, sql (the master's stores and sources), tf,
# torch (framework adapters), …; EXTRA_PACKAGES: more pip requirements, e.g. a CUDA build.
ARG EXTRAS=s3,etcd,sql
ARG EXTRA_PACKAGES=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
LABEL org.opencontainers.image.title="trainfeed" \
      org.opencontainers.image.description="Elastic master/worker data service for deep-learning training" \
      org.opencontainers.image.licenses="Apache-2.0"

# The uid/gid the Kubernetes manifests run as (runAsUser: 10001).
RUN groupadd --system --gid 10001 trainfeed \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --create-home \
       --shell /usr/sbin/nologin trainfeed

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libjpeg62-turbo \
    && rm -rf /var/lib/apt/lists/*

COPY --from=builder /wheels/ /tmp/wheels/
# Versions are the ranges of pyproject.toml, resolved at build time.
# hadolint ignore=DL3013,SC2086
RUN set -eu; \
    wheel="$(ls /tmp/wheels/trainfeed-*.whl)"; \
    if [ -n "$EXTRAS" ]; then wheel="${wheel}[${EXTRAS}]"; fi; \
    pip install --no-cache-dir "$wheel" $EXTRA_PACKAGES; \
    rm -rf /tmp/wheels; \
    trainfeed --version; \
    python -c 'from trainfeed.decode import _jpeg_region'  # the region decoder was built

USER 10001:10001
WORKDIR /app
# gRPC API and health (50051), Prometheus metrics (9090).
EXPOSE 50051 9090
ENTRYPOINT ["trainfeed"]
CMD ["--help"]
