# syntax=docker/dockerfile:1
#
# The forwarder's container image: one static binary on distroless/static
# (no shell, no package manager, no zoneinfo: the zone database is embedded
# in the binary), running as the non-root user 65532, with the shipped
# pipeline and mappings under /etc/forwarder, its working directory, so the
# pipeline's relative mapping paths resolve. docs/deployment.md.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t forwarder .
#   docker run --rm forwarder --version
#
# deploy/validate checks this file (user, paths, no remote ADD) and
# test/image builds the binary with the RUN line below and runs `forwarder
# lint` and `forwarder test` on the /etc/forwarder layout in an empty root.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first: this layer stays cached while only the sources change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG DATE_BUILT=unknown
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.dateBuilt=${DATE_BUILT}" -o /out/forwarder ./cmd/forwarder

# The compose stack's mock platform and event generator (cmd/devstack with
# -kafka-brokers), a dev tool kept out of the product image:
#   docker build --target devstack -t forwarder-devstack .
FROM build AS devstack-build
RUN CGO_ENABLED=0 go build -trimpath -o /out/devstack ./cmd/devstack

FROM gcr.io/distroless/static-debian12:nonroot AS devstack
COPY --from=devstack-build /out/devstack /usr/local/bin/devstack
USER nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/devstack"]

# The product image: the last stage, what a plain `docker build` makes.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/forwarder /usr/local/bin/forwarder
COPY pipelines/ /etc/forwarder/pipelines/
COPY mappings/ /etc/forwarder/mappings/
WORKDIR /etc/forwarder
# nonroot is uid/gid 65532 in distroless; the Helm chart runs as the same.
USER nonroot
EXPOSE 4195
HEALTHCHECK --interval=10s --timeout=6s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/forwarder", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/forwarder"]
CMD ["-c", "/etc/forwarder/pipelines/forwarder.yaml"]
