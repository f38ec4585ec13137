# tandemd with its CUDA module: built with the project's own scripts on Debian
# 12 plus NVIDIA's CUDA 13 packages for Debian 12, run on Debian 12 slim with
# the CUDA runtime and cuBLAS only. Needs the NVIDIA container toolkit on the
# host (`docker run --gpus all`, or the device plugin under Kubernetes).
#
#   docker build -f deploy/docker/cuda.Dockerfile -t tandem:cuda .
#   docker run --rm --gpus all -p 50051:50051 -p 9400:9400 -p 8000:8000 tandem:cuda
#
# TANDEM_CUDA_ARCHS: the GPU architectures compiled (CMAKE_CUDA_ARCHITECTURES).
# TANDEM_CXX_ARCH: the CPU the host-side kernels are compiled for (see
# cpu.Dockerfile).

ARG CUDA_MAJOR_MINOR=13-0

FROM debian:12 AS build
ARG CUDA_MAJOR_MINOR
ARG TANDEM_CUDA_ARCHS="80;90a"
ARG TANDEM_CXX_ARCH=x86-64-v3
ADD https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb /tmp/
RUN dpkg -i /tmp/cuda-keyring_1.1-1_all.deb \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      ca-certificates python3-pip cuda-nvcc-${CUDA_MAJOR_MINOR} \
      cuda-cudart-dev-${CUDA_MAJOR_MINOR} libcublas-dev-${CUDA_MAJOR_MINOR} \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:${PATH}
WORKDIR /src
COPY . .
RUN scripts/setup \
 && TANDEM_BUILD_DIR=/src/build-image scripts/build -DTANDEM_CUDA=ON -DTANDEM_NATIVE=OFF \
      -DCMAKE_CXX_FLAGS="-march=${TANDEM_CXX_ARCH}" \
      -DCMAKE_CUDA_ARCHITECTURES="${TANDEM_CUDA_ARCHS}" \
 && TANDEM_MODEL_DIR=/models scripts/fetch-model

FROM debian:12-slim
ARG CUDA_MAJOR_MINOR
ADD https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb /tmp/
RUN dpkg -i /tmp/cuda-keyring_1.1-1_all.deb && rm /tmp/cuda-keyring_1.1-1_all.deb \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libspdlog1.10 libfmt9 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 libssl3 libucx0 libzmq5 \
      cuda-cudart-${CUDA_MAJOR_MINOR} libcublas-${CUDA_MAJOR_MINOR} \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home tandem
# The daemon loads the module from ../lib next to its binary.
COPY --from=build /src/build-image/bin/tandemd /src/build-image/bin/tandem /opt/tandem/bin/
COPY --from=build /src/build-image/lib/libtandem_cuda.so /opt/tandem/lib/
COPY --from=build /models /models
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001
EXPOSE 50051 9400 8000
ENTRYPOINT ["/opt/tandem/bin/tandemd"]
CMD ["--model=/models/SmolLM2-135M-Instruct.Q4_1.gguf", "--listen=0.0.0.0:50051", \
     "--metrics_listen=0.0.0.0:9400", "--http_port=8000", "--drain_timeout=60s", "--device=auto"]
