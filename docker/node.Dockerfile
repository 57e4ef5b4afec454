# A playground host for distrun: OpenSSH server, python3 and a pinned CPU build of torch.
# Built and started by compose.yaml; see README.md in this directory.
FROM debian:12-slim

ARG TORCH_VERSION=2.13.0

RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        openssh-server python3 python3-venv iproute2 procps ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub \
    && mkdir -p /run/sshd

# One interpreter with torch at the same path on every host: the inventory's `python`.
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        "torch==${TORCH_VERSION}" numpy psutil

COPY sshd_config /etc/ssh/sshd_config.d/distrun.conf
COPY entrypoint.sh /usr/local/bin/distrun-node
RUN chmod 0755 /usr/local/bin/distrun-node

EXPOSE 22
ENTRYPOINT ["/usr/local/bin/distrun-node"]
