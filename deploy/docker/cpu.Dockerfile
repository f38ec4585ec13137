# tandemd for CPUs: built with the project's own scripts on Debian 12, run on
# Debian 12 slim with only the shared libraries it links.
#
#   docker build -f deploy/docker/cpu.Dockerfile -t tandem:cpu .
#   docker run --rm -p 50051:50051 -p 9400:9400 -p 8000:8000 tandem:cpu
#
# The default model (SmolLM2-135M-Instruct, Q4_1) is baked in at /models; run
# another by mounting it and passing --model=/path/to/model.gguf.
#
# TANDEM_CXX_ARCH: the CPU the kernels are compiled for. The project's own
# builds use -march=native; an image runs on machines it was not built on, so
# it defaults to x86-64-v3 (AVX2, FMA, F16C: every x86 server since 2015).
# Pass --build-arg TANDEM_CXX_ARCH=native for an image that only ever runs
# on hosts like the one that builds it.

FROM debian:12 AS build
ARG TANDEM_CXX_ARCH=x86-64-v3
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      ca-certificates python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# scripts/setup installs the build's Debian packages; scripts/build is what
# every developer and CI builds with; scripts/fetch-model downloads and checks
# the default model. The CUDA module is left out of this image.
RUN scripts/setup \
 && TANDEM_BUILD_DIR=/src/build-image scripts/build -DTANDEM_CUDA=OFF -DTANDEM_NATIVE=OFF \
      -DCMAKE_CXX_FLAGS="-march=${TANDEM_CXX_ARCH}" \
 && TANDEM_MODEL_DIR=/models scripts/fetch-model

FROM debian:12-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libspdlog1.10 libfmt9 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 libssl3 libucx0 libzmq5 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home tandem
COPY --from=build /src/build-image/bin/tandemd /src/build-image/bin/tandem /opt/tandem/bin/
COPY --from=build /models /models
USER 10001
EXPOSE 50051 9400 8000
# tandemd is PID 1: SIGTERM drains it (docs/operations.md). Flags after the
# image name on `docker run` replace these.
ENTRYPOINT ["/opt/tandem/bin/tandemd"]
CMD ["--model=/models/SmolLM2-135M-Instruct.Q4_1.gguf", "--listen=0.0.0.0:50051", \
     "--metrics_listen=0.0.0.0:9400", "--http_port=8000", "--drain_timeout=60s"]
