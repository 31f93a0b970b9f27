# syntax=docker/dockerfile:1
# smla-server for AMD Instinct MI355X (gfx950) on ROCm 7. The build steps live in
# scripts/container_build.sh, which CI runs without a container engine.
#   docker build -t smla:rocm7-gfx950 .
#   docker build --build-arg GPU_ARCH=gfx942 -t smla:rocm7-gfx942 .      (MI300X)
#   docker run --device /dev/kfd --device /dev/dri --group-add video --group-add render \
#     -p 50051:50051 -p 9464:9464 smla:rocm7-gfx950
ARG ROCM_IMAGE=rocm/dev-ubuntu-24.04:7.0-complete
# The runtime image must be the build image's Ubuntu release: the build script lists that
# release's package names.
ARG RUNTIME_IMAGE=ubuntu:24.04

FROM ${ROCM_IMAGE} AS build
ARG GPU_ARCH=gfx950
WORKDIR /src
COPY . .
RUN ./scripts/container_build.sh --backend hip --arch "${GPU_ARCH}" --prefix /opt/smla \
      --build-dir /tmp/smla-build

# Only the binaries, the ROCm libraries they load (bundled under /opt/smla/lib by the build
# script) and the Ubuntu packages that provide the rest.
FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=build /opt/smla /opt/smla
RUN apt-get update \
 && xargs -a /opt/smla/share/smla/runtime-packages.txt \
      env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* \
 && (getent group video || groupadd --system video) \
 && (getent group render || groupadd --system render) \
 && useradd --system --uid 10001 --user-group --groups video,render --no-create-home smla
ENV PATH=/opt/smla/bin:${PATH} LD_LIBRARY_PATH=/opt/smla/lib
USER 10001
EXPOSE 50051 9464
# Pool allocation and the warm-up launch come before the server listens: a long start period.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
  CMD ["/opt/smla/bin/smla", "--server", "127.0.0.1:50051", "--timeout_s", "3", "health"]
ENTRYPOINT ["/opt/smla/bin/smla-server"]
# Beyond loopback the server wants credentials: bearer tokens from a mounted file ("token
# tenant" per line; health checks need none). TLS: add --tls_cert/--tls_key (deploy/README.md).
CMD ["--config=/opt/smla/share/smla/server.textproto", "--backend=hip", \
     "--token_file=/etc/smla/tokens/tokens"]
