# syntax=docker/dockerfile:1
# The service image: python:3.11-slim, the serving extra only (no torch), the bundled (committed) model
# and the ONNX variants the service may run, derived at build time.
#   docker build -t dialogue-safety .                                # CPU (onnxruntime)
#   docker build -t dialogue-safety:gpu --build-arg RUNTIME=gpu .   # GPU (onnxruntime-gpu + CUDA wheels)
#   git archive HEAD | docker build -t dialogue-safety -             # the committed tree only, nothing uncommitted
#   docker run -p 8000:8000 dialogue-safety                          # GPU: add --gpus all
# Settings come from SAFETY_* variables (docs/api.md). .dockerignore lets in only the serving code and the
# public API (dialogue_safety.__all__, Client included), the package metadata and the committed files of
# models/default (no derived variants; tests/test_image_contents.py checks the list against the imports).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG RUNTIME=cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY constraints/serve.txt ./constraints/serve.txt
COPY dialogue_safety ./dialogue_safety
COPY models/default ./models/default
# The package installs the model as data files: /opt/venv/share/dialogue-safety/models/default,
# where `dialogue-safety serve` finds it (dialogue_safety.core.model_dir.default_model_dir).
# The versions CI tested: constraints/serve.txt (scripts/lock.sh); onnxruntime-gpu is not in it.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir -c constraints/serve.txt ".[serve]" \
 && if [ "$RUNTIME" = "gpu" ]; then \
      pip uninstall -y onnxruntime && pip install --no-cache-dir "onnxruntime-gpu[cuda,cudnn]"; \
    elif [ "$RUNTIME" != "cpu" ]; then \
      echo "RUNTIME must be cpu or gpu, got $RUNTIME" >&2; exit 1; \
    fi
# Derive the variants the service may run (CPU: every one the runtime may pick on any CPU family, the card's
# `cpu_defaults`; GPU: its GPU default; an int8 default with its fp32 check keeps the fp32 graph too) and remove
# every other derived file (intermediates, the lock file): the container starts without deriving.
RUN python -m dialogue_safety.core.variants /opt/venv/share/dialogue-safety/models/default "$RUNTIME" --prune

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SAFETY_HOST=0.0.0.0 \
    SAFETY_PORT=8000 \
    SAFETY_MODEL_DIR=/opt/venv/share/dialogue-safety/models/default
RUN groupadd --gid 10001 safety \
 && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin safety
COPY --from=build /opt/venv /opt/venv
WORKDIR /home/safety
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('SAFETY_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["dialogue-safety", "serve"]
