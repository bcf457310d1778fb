# The gateway as a container image: `gateway serve`, embedded (SQLite under /data) by default,
# or one of many replicas sharing Redis when GATEWAY_REDIS_URL is set (see compose.yaml).
#
#   docker build -t durable-gateway .
#   docker run --rm -e GATEWAY_HOST=0.0.0.0 -e GATEWAY_OPS_TOKENS -p 127.0.0.1:8787:8787 \
#       -v gateway-data:/data durable-gateway
#
# The image does not set GATEWAY_HOST: the default (127.0.0.1) is not reachable through a
# published port, so `docker run` and compose.yaml set GATEWAY_HOST=0.0.0.0 themselves, with
# GATEWAY_OPS_TOKENS (required beyond loopback). The web channel has no login: publish the port
# on 127.0.0.1 or behind an authenticating proxy. See docs/deploy.md.
# Nor does it set GATEWAY_STORE_URL: an explicit store URL would win over GATEWAY_REDIS_URL.
#
# tests/test_packaging.py runs the builder stage's COPY and RUN steps (outside Docker) in a fresh
# venv and starts the installed `gateway serve`: keep them plain (COPY of context paths, RUN of
# single commands that only touch /opt/venv, /wheels and the WORKDIR).

FROM python:3.11-slim AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY harness_core/ harness_core/
COPY adapters/ adapters/
COPY gateway/ gateway/
COPY config/ config/

RUN python -m venv /opt/venv
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels .
RUN /opt/venv/bin/pip install /wheels/durable_gateway-*.whl


FROM python:3.11-slim AS runtime

# A fixed numeric uid/gid, so orchestrators can check it is not root (runAsNonRoot).
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin gateway \
    && mkdir -p /data \
    && chown gateway:gateway /data

# Only the venv: no compiler, no source tree, no wheel cache.
COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1

# The embedded default store (sqlite:///.gateway/gateway.db) is relative to the working
# directory: /data/.gateway/ here. Mount a volume on /data to keep it.
WORKDIR /data
VOLUME /data

USER 10001:10001

EXPOSE 8787

# No curl in slim images: the venv's Python asks /healthz (the port follows GATEWAY_PORT).
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GATEWAY_PORT', '8787'), timeout=4)"]

# SIGTERM (docker stop) drains: give it GATEWAY_SHUTDOWN_SECONDS (15 s by default) plus a margin,
# e.g. `docker stop -t 20` or compose's stop_grace_period.
STOPSIGNAL SIGTERM

ENTRYPOINT ["gateway"]
CMD ["serve"]
