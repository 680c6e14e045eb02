# The moeq image: one `moeq` binary (coordinator, worker, submit, status, ...) and `bench-engine`
# built with the engine's CUDA backend (engine/cuda/, cuBLAS from the toolkit
# image, NCCL from NVIDIA's apt repository that the image configures), for
# docker-compose.yml and deploy/k8s/.
#
#   docker build -t moeq .                       # Hopper + Ampere kernels
#   docker build --build-arg CUDA_ARCHS=89 -t moeq .
#
# CUDA 13.0: the line the project's pinned wheels (scripts/setup.d/40-cuda-wheels.sh)
# and its CI compile against.
#
# Ubuntu 24.04 CUDA images: NVIDIA publishes no Debian ones. Its hiredis (1.2)
# ships hiredis_ssl, so this image speaks TLS to Redis (redis.tls / rediss://).
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
ARG CUDA_ARCHS="80;90"
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config librdkafka-dev libhiredis-dev libmsgpack-c-dev libcjson-dev \
      libpcre2-dev libopenblas-dev libibverbs-dev libmicrohttpd-dev libcmocka-dev libssl-dev libucx-dev \
      libnccl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DMOEQ_NATIVE=OFF -DMOEQ_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS}" \
    && cmake --build /build -j"$(nproc)" --target moeq bench-engine

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
# The -dev packages pull in exactly the runtime libraries the binary links,
# whatever this release names them (t64 renames and all); they are small.
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      librdkafka-dev libhiredis-dev libmsgpack-c-dev libcjson-dev libpcre2-dev libopenblas-dev \
      libibverbs-dev libmicrohttpd-dev libucx-dev libnccl2 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 moeq \
    && mkdir -p /models && chown moeq /models
# /models is owned by moeq so that a fresh named volume mounted there is
# writable for docker-compose.yml's model-init (it copies this ownership).
COPY --from=build /build/cli/moeq /usr/local/bin/moeq
# bench-engine beside it: `bench-engine --tune all` picks this host's CPU kernel keys (docs/BENCHMARKS.md), and
# its figures are the ones docs/ENGINE.md quotes. (docker run --entrypoint bench-engine moeq --model /models/...)
COPY --from=build /build/bench/bench-engine /usr/local/bin/bench-engine
# The CUDA backend is a plugin the engine loads on first use, from ../lib/moeq beside the binary.
COPY --from=build /build/engine/libmoeq_backend_cuda.so /usr/local/lib/moeq/libmoeq_backend_cuda.so
USER moeq
ENTRYPOINT ["moeq"]
CMD ["--help"]
