#!/usr/bin/env bash
# sdk-check.sh: run the official Anthropic and OpenAI Go SDKs against
# Sluice in front of its simulated demo fleet (scripts/sdk-check). Needs
# only Go and the module proxy (the SDKs are fetched into that module,
# never into Sluice's go.mod). Exit status 0 when every call got what a
# client expects.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'kill "$demo" 2>/dev/null || true; wait "$demo" 2>/dev/null || true; rm -rf "$work"' EXIT
go build -o "$work/sluice" ./cmd/sluice
(cd scripts/sdk-check && go build -o "$work/sdk-check" .)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 18080)
"$work/sluice" demo --load=false --listen "127.0.0.1:$port" --quiet --state "$work/state" > "$work/demo.log" 2>&1 &
demo=$!
base="http://127.0.0.1:$port"
for _ in $(seq 1 100); do
  if curl -fs -o /dev/null "$base/v1/models"; then break; fi
  if ! kill -0 "$demo" 2>/dev/null; then cat "$work/demo.log"; exit 1; fi
  sleep 0.1
done
model=$(curl -fs "$base/v1/models" | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -1)
"$work/sdk-check" -base "$base" -model "$model"
