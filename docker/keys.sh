#!/bin/sh
# Make the playground's keys in docker/.ssh: a client key for distrun, a host key per node,
# and the known_hosts file that lets inventory/docker.yaml verify them (strict policy).
# Idempotent: existing keys are kept, so known_hosts stays valid across rebuilds.
set -eu
cd "$(dirname "$0")"
mkdir -p .ssh
chmod 0700 .ssh
[ -f .ssh/id_ed25519 ] || ssh-keygen -q -t ed25519 -N "" -C distrun-playground -f .ssh/id_ed25519
: > .ssh/known_hosts.tmp
port=2220
for node in node0 node1 node2; do
    key=".ssh/${node}_host_ed25519_key"
    [ -f "$key" ] || ssh-keygen -q -t ed25519 -N "" -C "$node" -f "$key"
    echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$key.pub")" >> .ssh/known_hosts.tmp
    port=$((port + 1))
done
mv .ssh/known_hosts.tmp .ssh/known_hosts
echo "keys ready in $(pwd)/.ssh"
