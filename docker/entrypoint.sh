#!/bin/sh
# Install this host's key and the controller's public key from the read-only mount, then run sshd.
set -eu
keys=/distrun-keys
host_key="$keys/$(hostname)_host_ed25519_key"
if [ ! -f "$host_key" ] || [ ! -f "$keys/id_ed25519.pub" ]; then
    echo "distrun-node: $host_key or $keys/id_ed25519.pub missing; run docker/keys.sh first" >&2
    exit 1
fi
install -m 0600 "$host_key" /etc/ssh/ssh_host_ed25519_key
install -m 0644 "$host_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
install -d -m 0700 /root/.ssh
install -m 0600 "$keys/id_ed25519.pub" /root/.ssh/authorized_keys
exec /usr/sbin/sshd -D -e
