# kvroute ext_proc server: static binary on a distroless base, non-root.
#   docker build -t kvroute .
#   docker run -p 9002:9002 -p 9090:9090 -v $PWD/my.yaml:/etc/kvroute/kvroute.yaml kvroute
FROM golang:1.27.3-bookworm AS build
# go.mod needs Go 1.27; never let the image switch toolchains behind our back.
ENV GOTOOLCHAIN=go1.27.3
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/extproc ./cmd/extproc \
 && /out/extproc validate -config examples/kvroute.yaml

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/extproc /usr/local/bin/extproc
COPY examples/kvroute.yaml /etc/kvroute/kvroute.yaml
USER nonroot:nonroot
# 9002: ext_proc gRPC and gRPC health; 9090: /metrics, /healthz, /readyz, GET /policy
# (PUT /policy and POST /reload answer only loopback unless admin_remote_changes is set).
EXPOSE 9002 9090
ENTRYPOINT ["/usr/local/bin/extproc"]
# The admin port listens on all interfaces inside the container so it can be scraped.
CMD ["-config", "/etc/kvroute/kvroute.yaml", "-admin-address", "0.0.0.0:9090"]
