# The catalog image: the File-Based Catalog rendered by `make catalog`, served
# by opm. Build it from the repository root:
#   docker build -f catalog.Dockerfile -t ghcr.io/model-orchestra/orchestra-operator-catalog:latest .
# and the image-less catalog (bundles install from their inline objects):
#   docker build -f catalog.Dockerfile --build-arg CONFIGS=catalog/inline \
#     -t ghcr.io/model-orchestra/orchestra-operator-catalog-inline:latest .
# The base image provides /bin/opm (with its serve subcommand) and
# /bin/grpc_health_probe.
ARG OPM_IMAGE=quay.io/operator-framework/opm:v1.48.0
FROM ${OPM_IMAGE}
ARG CONFIGS=catalog/configs

ENTRYPOINT ["/bin/opm"]
CMD ["serve", "/configs", "--cache-dir=/tmp/cache"]

# The declarative config root, and a pre-populated serve cache so that the
# catalog starts fast and read-only.
ADD ${CONFIGS} /configs
RUN ["/bin/opm", "serve", "/configs", "--cache-dir=/tmp/cache", "--cache-only"]

# Where OLM finds the declarative config in the image.
LABEL operators.operatorframework.io.index.configs.v1=/configs
