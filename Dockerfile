# The image of psfleet's cluster routes (docs/cluster.md): psfleet with the CPU build of
# PyTorch, working directory /workspace (where `psfleet k8s render` puts config.yaml).
#
#   docker build -t REGISTRY/psfleet:0.1.0 .
#
# Your job's own files (data, a model module) go in an image built FROM this one:
#
#   FROM REGISTRY/psfleet:0.1.0
#   COPY data/ /workspace/data/
#
# For a CUDA build of PyTorch pass --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126
# (and a base image with the NVIDIA driver's user-space libraries).
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
# g++ compiles the sparse table's native core (setup.py) at the install below.
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md setup.py /opt/psfleet/
COPY psfleet /opt/psfleet/psfleet
RUN pip install /opt/psfleet && rm -rf /opt/psfleet

WORKDIR /workspace
CMD ["psfleet", "--help"]
