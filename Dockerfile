# One image for every Janus service; docker-compose picks the service with `janus serve <service>`.
FROM python:3.11-slim

# libibverbs1: the Mooncake transfer engine links against it (TCP transport on machines without RDMA)
RUN apt-get update && apt-get install -y --no-install-recommends libibverbs1 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/janus
# CPU torch from the PyTorch index (PyPI's default torch is a multi-GB CUDA build); GPU hosts build FROM a CUDA base
# and install the `cuda` extra instead of `cpu`.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY contracts contracts
COPY runtime runtime
COPY gateway gateway
COPY dispatcher dispatcher
COPY oracle oracle
COPY planner planner
COPY worker worker
COPY ops ops
COPY sim sim
RUN pip install --no-cache-dir ".[cpu]"
COPY deploy/cluster.docker.yaml /etc/janus/cluster.yaml

# Non-root: a fixed uid (10001, what deploy/k8s runs as) that owns only the state directory; a named volume mounted
# there takes its ownership. HOME in /tmp: libraries that cache (torch, transformers) write there, which also works
# on a read-only root filesystem with /tmp mounted writable (deploy/k8s).
RUN groupadd --gid 10001 janus && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin janus \
    && mkdir -p /var/lib/janus && chown 10001:10001 /var/lib/janus
USER 10001:10001

ENV JANUS_STATE_DIR=/var/lib/janus JANUS_CONFIG=/etc/janus/cluster.yaml PYTHONUNBUFFERED=1 HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT []
CMD ["janus", "--help"]
