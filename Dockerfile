# The worker's release image: the static worker and submit binaries, CA certificates and a
# non-root user, nothing else (no shell, no package manager, no libc). It needs no registry:
# `make image` builds the binaries and stages every file under bin/image first, so this file
# only copies. See deploy/helm/boxcar for how the chart runs it.
#
#   make image        # ghcr.io/boxcar-run/boxcar:<git describe>; IMAGE=name:tag to change it
#   docker run --rm --network host --read-only --tmpfs /tmp --cap-drop ALL \
#     -e AWS_ACCESS_KEY_ID -e AWS_SECRET_ACCESS_KEY -e OPENAI_API_KEY \
#     -v $PWD/boxcar.yaml:/etc/boxcar/config/boxcar.yaml:ro \
#     ghcr.io/boxcar-run/boxcar:TAG --config=/etc/boxcar/config/boxcar.yaml
FROM scratch

ARG VERSION=dev
LABEL org.opencontainers.image.title="boxcar-worker" \
      org.opencontainers.image.description="Boxcar worker: runs LLM agent jobs from NATS JetStream in sandboxes" \
      org.opencontainers.image.source="https://github.com/boxcar-run/boxcar" \
      org.opencontainers.image.version="${VERSION}"

# 65532 is the chart's runAsUser/runAsGroup; a passwd entry gives it a name and a home that
# Go's os/user and the AWS SDK can resolve without a libc.
COPY bin/image/passwd /etc/passwd
COPY bin/image/group /etc/group
# The store (S3 over HTTPS) and the model API need the public CAs; Go reads this bundle.
COPY bin/image/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY bin/image/worker bin/image/submit /usr/local/bin/

# The chart mounts an emptyDir at /tmp (the root filesystem is read-only); HOME points there so
# nothing tries to write into /.
ENV HOME=/tmp
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/worker"]
