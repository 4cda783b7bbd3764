# edgespec on a Jetson with JetPack 6.1 to 6.2.2 (L4T r36.4, r36.5: all CUDA 12.6), as a container: NVIDIA's own l4t-jetpack image (Ubuntu
# 22.04, Python 3.10, CUDA 12.6, cuDNN 9, TensorRT 10 inside the image), NVIDIA's onnxruntime-gpu for JetPack 6 from
# the Jetson AI Lab index, then edgespec[server] and the export half, neither of which pulls an onnxruntime (the CPU
# wheel would replace the GPU one). Build and run it on the board (docs/jetson.md, "A container"):
#   docker build -f systemd/jetson.Dockerfile -t edgespec:jp6 .
#   docker run --runtime nvidia --rm -p 8000:8000 -v "$PWD/bundles:/bundles:ro" edgespec:jp6 \
#     serve /bundles/qwen-coder-cuda --host 0.0.0.0 --parallel 2
# The base's tag should match the board's L4T release (cat /etc/nv_tegra_release: R36 REVISION 4.x -> r36.4.0; an
# r36.5.0 board: --build-arg BASE_IMAGE=nvcr.io/nvidia/l4t-jetpack:<its tag>, the release table devices/_releases.json
# lists which releases take this wheel); JetPack 6.0 (r36.3, CUDA 12.2) cannot load the CUDA 12.6 wheel. A jetson-containers image with CUDA 12.6
# (dustynv/...:r36.4.0) works as a base too: --build-arg BASE_IMAGE=...
# tests/install/test_container_recipe.py checks its pip lines against edgespec's floors and resolves edgespec's
# own for cp310 aarch64; the image itself is built on a board, not in the test suite.
ARG BASE_IMAGE=nvcr.io/nvidia/l4t-jetpack:r36.4.0
FROM ${BASE_IMAGE}

ARG ORT_INDEX=https://pypi.jetson-ai-lab.io/jp6/cu126
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 PIP_NO_CACHE_DIR=1

RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*

# onnxruntime-gpu first, fetched alone from NVIDIA's index (--index-url: PyPI's aarch64 onnxruntime-gpu wheels are
# SBSA server builds that fail on Orin), installed from the file so its other requirements come from PyPI
RUN python3 -m venv /opt/edgespec/venv \
    && /opt/edgespec/venv/bin/pip install --upgrade pip \
    && /opt/edgespec/venv/bin/pip download --no-deps -d /tmp/ort-gpu 'onnxruntime-gpu>=1.23.0' --index-url "${ORT_INDEX}" \
    && /opt/edgespec/venv/bin/pip install /tmp/ort-gpu/onnxruntime_gpu-*.whl \
    && rm -rf /tmp/ort-gpu
# the runtime's sources (edgespec/devices is a link to the top-level devices/) and the export half (a .gguf
# exports on the board, no torch)
COPY pyproject.toml README.md /opt/edgespec/src/
COPY devices /opt/edgespec/src/devices
COPY edgespec /opt/edgespec/src/edgespec
COPY export /opt/edgespec/src/export
RUN /opt/edgespec/venv/bin/pip install '/opt/edgespec/src[server]' /opt/edgespec/src/export \
    && /opt/edgespec/venv/bin/python -c "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers(), o.get_available_providers()"

ENV PATH=/opt/edgespec/venv/bin:${PATH}
EXPOSE 8000
ENTRYPOINT ["edgespec"]
CMD ["--help"]
