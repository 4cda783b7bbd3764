# edgespec on a Jetson with JetPack 6, as a container in the jetson-containers style: Ubuntu 22.04 with the
# CUDA components added from NVIDIA's Jetson apt repository (JetPack 6 no longer mounts CUDA from the host),
# Python 3.10, NVIDIA's onnxruntime-gpu for JetPack 6, then edgespec[server] (no [cpu]: the CPU onnxruntime
# would shadow the GPU one). Build and run it on the board (docs/jetson.md):
#   docker build -f systemd/jetson.Dockerfile -t edgespec:jp6 .
#   docker run --runtime nvidia --rm -p 8000:8000 -v "$PWD/bundles:/bundles:ro" edgespec:jp6 \
#     serve /bundles/qwen-coder-cuda --host 0.0.0.0 --parallel 2
# tests/install/test_container_recipe.py checks its pip lines against edgespec's floors.
ARG BASE_IMAGE=ubuntu:22.04
FROM ${BASE_IMAGE}

# L4T release of the board's JetPack 6 (cat /etc/nv_tegra_release: R36 REVISION 4.x -> r36.4)
ARG L4T_RELEASE=r36.4
ARG CUDA_VERSION=12-6
ARG ORT_INDEX=https://pypi.jetson-ai-lab.io/jp6/cu126
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 PIP_NO_CACHE_DIR=1

RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl gnupg \
        python3 python3-venv python3-pip \
    && curl -fsSL https://repo.download.nvidia.com/jetson/jetson-ota-public.asc \
        | gpg --dearmor -o /usr/share/keyrings/jetson-ota.gpg \
    && printf 'deb [signed-by=/usr/share/keyrings/jetson-ota.gpg] https://repo.download.nvidia.com/jetson/%s %s main\n' \
        common "${L4T_RELEASE}" t234 "${L4T_RELEASE}" > /etc/apt/sources.list.d/nvidia-l4t.list \
    && apt-get update && apt-get install -y --no-install-recommends \
        "cuda-cudart-${CUDA_VERSION}" "libcublas-${CUDA_VERSION}" "libcufft-${CUDA_VERSION}" \
        "libcurand-${CUDA_VERSION}" libcudnn9-cuda-12 \
    && rm -rf /var/lib/apt/lists/*
ENV LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH}

# onnxruntime-gpu first, from NVIDIA's JetPack 6 index (PyPI has no CUDA build for aarch64; its other
# requirements come from PyPI), then edgespec, whose requirements pull no onnxruntime
RUN python3 -m venv /opt/edgespec/venv \
    && /opt/edgespec/venv/bin/pip install --upgrade pip \
    && /opt/edgespec/venv/bin/pip install 'onnxruntime-gpu>=1.23.0' --extra-index-url "${ORT_INDEX}"
# the runtime's sources only (edgespec/devices is a link to the top-level devices/)
COPY pyproject.toml README.md /opt/edgespec/src/
COPY devices /opt/edgespec/src/devices
COPY edgespec /opt/edgespec/src/edgespec
RUN /opt/edgespec/venv/bin/pip install '/opt/edgespec/src[server]' \
    && /opt/edgespec/venv/bin/python -c "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers(), o.get_available_providers()"

ENV PATH=/opt/edgespec/venv/bin:${PATH}
EXPOSE 8000
ENTRYPOINT ["edgespec"]
CMD ["--help"]
