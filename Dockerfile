# syntax=docker/dockerfile:1.7
#
# One image for every process (`automq broker|controller|operator|local`), plus a Spark
# image for the compaction and lake-ingestion jobs.
#
#   docker build --target runtime -t ghcr.io/automq-py/automq:0.1.0 .        (default target)
#   docker build --target spark   -t ghcr.io/automq-py/automq-spark:0.1.0 .
#
# Stages: `builder` turns the source into wheels (the project and every dependency), the
# final stages install only those wheels, so no compiler, pip cache or source tree ships.
# `runtime` is the last stage so that a plain `docker build .` produces it.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG VERSION=0.1.0

# ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first, from pyproject.toml alone, so a change to the source reuses these layers
# instead of downloading and building every dependency again (the Spark set includes the
# 456 MB pyspark sdist: minutes on a small machine).
# No compiler here: every dependency publishes manylinux wheels for amd64 and arm64 (pyspark is
# a pure-Python sdist). On another architecture, install build-essential in this stage only.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
open('runtime.txt', 'w').write('\n'.join(p['dependencies'])); \
open('spark.txt', 'w').write('\n'.join(p['optional-dependencies']['spark']))" \
 && pip wheel --wheel-dir /wheels/runtime -r runtime.txt

# The Spark extra is large (pyspark ships its jars); only the `spark` target pulls it in.
FROM deps AS spark-deps
RUN pip wheel --wheel-dir /wheels/spark --find-links /wheels/runtime -r runtime.txt -r spark.txt

FROM deps AS builder
# Only what the wheel is built from (see .dockerignore): a change to tests or docs does not
# invalidate this layer.
COPY setup.py README.md ./
COPY broker/ broker/
COPY operator/ operator/
COPY spark-jobs/ spark-jobs/
# The manifest (sha256 of every wheel) ships in the image: it says exactly what is installed,
# and COPYing it makes the install step's cache honest. buildah (podman build) leaves a RUN's
# --mount=from content out of its cache key, so without a COPY of something that changes with
# the wheels, a rebuilt builder would leave the previous package installed.
RUN pip wheel --no-deps --wheel-dir /wheels/runtime . \
 && sha256sum /wheels/runtime/*.whl > /wheels/runtime.sha256

FROM spark-deps AS spark-wheels
COPY --from=builder /wheels/runtime/automq_py-*.whl /wheels/spark/
RUN sha256sum /wheels/spark/*.whl > /wheels/spark.sha256

# ---------------------------------------------------------------------------------------
# What both final images share: the unprivileged user and a Python that does not write
# bytecode next to read-only site-packages.
FROM ${PYTHON_IMAGE} AS base
ARG VERSION
LABEL org.opencontainers.image.title="automq-py" \
      org.opencontainers.image.description="Kafka-compatible streaming on object storage: broker, controller and Kubernetes operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/automq-py/automq-py" \
      org.opencontainers.image.vendor="automq-py"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# uid/gid 10001: above the range distributions hand out, so it never collides with a host
# user, and numeric so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
# data/ and objects/ exist owned by the user because Docker, unlike podman, mounts a new named
# volume with the ownership of the directory it covers (root if the image lacks it).
RUN groupadd --system --gid 10001 automq \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/automq --create-home \
            --shell /usr/sbin/nologin automq \
 && mkdir -p /var/lib/automq/data /var/lib/automq/objects \
 && chown -R 10001:10001 /var/lib/automq
WORKDIR /var/lib/automq

# ---------------------------------------------------------------------------------------
FROM base AS spark
ARG VERSION
# Debian's security archive drops superseded versions, so an exact version pin would make the
# image unbuildable after the next JRE security update; the pinned base image tag fixes the
# distribution (bookworm) and so the major versions (OpenJDK 17, tini 0.19, procps 4).
# tini reaps the JVM's children and forwards signals; Spark's launch scripts need ps (procps).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps \
 && rm -rf /var/lib/apt/lists/*
COPY --from=spark-wheels /wheels/spark.sha256 /usr/local/share/automq/wheels.sha256
RUN --mount=type=bind,from=spark-wheels,source=/wheels/spark,target=/wheels \
    pip install --no-index --find-links=/wheels "automq-py[spark]==${VERSION}" \
 && python -m pip uninstall --yes pip setuptools wheel
# The pip-installed pyspark is a complete Spark distribution (bin/, jars/ incl.
# spark-kubernetes). /opt/spark (Spark's own images' SPARK_HOME) links to wherever pip put it,
# so the path does not depend on the base image's Python version or layout; the entrypoint
# finds JAVA_HOME from `java` on PATH. /opt/automq/spark-job.py is the file spark-submit runs
# in the operator's CronJobs (automq.operator.sparkjobs.SPARK_JOB_FILE), linked the same way.
RUN ln -s "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" /opt/spark \
 && test -d /opt/spark/jars \
 && mkdir -p /opt/automq \
 && ln -s "$(python -c 'import automq.spark.submit as m; print(m.__file__)')" /opt/automq/spark-job.py \
 && test -f /opt/automq/spark-job.py
ENV SPARK_HOME=/opt/spark \
    PYSPARK_PYTHON=python3 \
    PYSPARK_DRIVER_PYTHON=python3
COPY --chmod=0755 scripts/spark-entrypoint.sh /usr/local/bin/spark-entrypoint.sh
USER 10001:10001
HEALTHCHECK NONE
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/spark-entrypoint.sh"]

# ---------------------------------------------------------------------------------------
FROM base AS runtime
ARG VERSION
COPY --from=builder /wheels/runtime.sha256 /usr/local/share/automq/wheels.sha256
RUN --mount=type=bind,from=builder,source=/wheels/runtime,target=/wheels \
    pip install --no-index --find-links=/wheels "automq-py==${VERSION}" \
 && python -m pip uninstall --yes pip setuptools wheel
USER 10001:10001
# Kafka listener, controller API, broker metrics/health, operator liveness.
EXPOSE 9092 9093 9094 8080
# Kubernetes probes /healthz and /readyz on the HTTP port; a Docker HEALTHCHECK would run a
# second, differently-timed check inside the container.
HEALTHCHECK NONE
ENTRYPOINT ["automq"]
CMD ["--help"]
