# GPU image: the gateway with the Higgs Audio v3 talker on vLLM 0.26 (CUDA).
#   docker build -t speech-gateway .
#   docker run --gpus all -p 8000:8000 -v ~/.cache/huggingface:/root/.cache/huggingface \
#       speech-gateway --model bosonai/higgs-audio-v3
# The vLLM image brings CUDA, PyTorch and vLLM; this layer adds the gateway.
FROM vllm/vllm-openai:v0.26.0

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    VLLM_USE_V2_MODEL_RUNNER=1 \
    HF_HUB_OFFLINE=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends libopus0 espeak-ng \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/speech-gateway
COPY pyproject.toml README.md LICENSE ./
COPY gateway ./gateway
COPY realtime_engine ./realtime_engine
COPY bench ./bench
COPY web_demo ./web_demo
# torch and vllm come from the base image; pip keeps them as they are.
# [redis]: replicas share voices through --voice-store (deploy/docker-compose.yml).
RUN python3 -m pip install --no-cache-dir ".[server,gpu,redis]"

EXPOSE 8000
ENTRYPOINT ["speech-gateway", "serve", "--host", "0.0.0.0", "--port", "8000", "--engine", "higgs"]
CMD []
