# clusterft pipeline image: `docker run` runs `dvc repro` (every stage of dvc.yaml).
#   CPU (default): docker build -t clusterft .
#   CUDA:          docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t clusterft:cuda .
# torch==2.13.0 comes from the package's pin; TORCH_INDEX only picks its build (+cpu or
# +cuXXX, whose wheels carry the CUDA runtime: the host needs the NVIDIA driver only).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/venv \
    && pip install --no-cache-dir --extra-index-url "${TORCH_INDEX}" . \
    && python -c "import torch; print('torch', torch.__version__)"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DVC_NO_ANALYTICS=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
RUN groupadd --gid 1000 app \
    && useradd --create-home --uid 1000 --gid 1000 --shell /usr/sbin/nologin app \
    && install -d -o 1000 -g 1000 /app
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --chown=1000:1000 . .
USER 1000:1000
# The image has no git: DVC runs without an SCM. Mount /app/artifacts to keep the outputs.
RUN dvc config --local core.no_scm true \
    && mkdir -p artifacts
CMD ["dvc", "repro"]
