# syntax=docker/dockerfile:1
# The service image: python:3.11-slim, the serving extra only (no torch), the bundled model.
#   docker build -t dialogue-safety .                      # CPU (onnxruntime)
#   docker build -t dialogue-safety:gpu --build-arg RUNTIME=gpu .   # GPU (onnxruntime-gpu + CUDA wheels)
#   docker run -p 8000:8000 dialogue-safety                # GPU: add --gpus all
# models/default must exist (train + export it first); settings come from SAFETY_* variables.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG RUNTIME=cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY cli ./cli
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[serve]" \
 && if [ "$RUNTIME" = "gpu" ]; then \
      pip uninstall -y onnxruntime && pip install --no-cache-dir "onnxruntime-gpu[cuda,cudnn]"; \
    elif [ "$RUNTIME" != "cpu" ]; then \
      echo "RUNTIME must be cpu or gpu, got $RUNTIME" >&2; exit 1; \
    fi

FROM ${PYTHON_IMAGE}
ARG RUNTIME=cpu
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SAFETY_HOST=0.0.0.0 \
    SAFETY_PORT=8000 \
    SAFETY_MODEL_DIR=/app/models/default
RUN groupadd --gid 10001 safety \
 && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin safety
COPY --from=build /opt/venv /opt/venv
COPY models/default /app/models/default
# Derive the ONNX variant the service will run (the card's cpu_variant or gpu_variant) now, as
# root, into the model directory: the container starts without deriving anything.
RUN python -c "import sys; from service.model_card import ModelCard; from service.variants import ensure_variant; \
card = ModelCard.load('/app/models/default'); \
print(ensure_variant('/app/models/default', card.gpu_variant if sys.argv[1] == 'gpu' else card.cpu_variant, card))" \
    "$RUNTIME"
WORKDIR /app
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('SAFETY_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["dialogue-safety", "serve"]
