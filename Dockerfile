# syntax=docker/dockerfile:1
# The project's images for people who have Docker. `make images` builds the
# same images without a Docker engine (static binary at /<name>, non-root
# user 65532, no shell). Build one with, for example:
#   docker build --target orchestra-gateway -t ghcr.io/model-orchestra/orchestra-gateway:v1.0.0 .

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=1.0.0
ENV CGO_ENABLED=0
RUN mkdir -p /out && \
    go build -trimpath -ldflags "-s -w -X github.com/model-orchestra/operator/internal/version.Version=${VERSION}" -o /out/ \
      ./cmd/orchestra-operator ./cmd/orchestra-gateway ./cmd/orchestra-dispatcher ./cmd/orchestra-fetch ./cmd/orchestra-sim && \
    go build -trimpath -ldflags "-s -w" -o /out/nats-server github.com/nats-io/nats-server/v2

# A static, shell-less base that runs as a non-root user.
FROM gcr.io/distroless/static-debian12:nonroot AS base
USER 65532:65532

FROM base AS orchestra-gateway
COPY --from=build /out/orchestra-gateway /orchestra-gateway
ENTRYPOINT ["/orchestra-gateway"]

FROM base AS orchestra-dispatcher
COPY --from=build /out/orchestra-dispatcher /orchestra-dispatcher
ENTRYPOINT ["/orchestra-dispatcher"]

FROM base AS orchestra-fetch
COPY --from=build /out/orchestra-fetch /orchestra-fetch
ENTRYPOINT ["/orchestra-fetch"]

FROM base AS orchestra-sim
COPY --from=build /out/orchestra-sim /orchestra-sim
ENTRYPOINT ["/orchestra-sim"]

FROM base AS nats-server
COPY --from=build /out/nats-server /nats-server
ENTRYPOINT ["/nats-server"]

# The operator is the default target.
FROM base AS orchestra-operator
COPY --from=build /out/orchestra-operator /orchestra-operator
ENTRYPOINT ["/orchestra-operator"]
