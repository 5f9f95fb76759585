#!/usr/bin/env bash
# Sluice in front of two real llama.cpp llama-servers.
#
# Builds llama-server (CPU only) from the llama.cpp source that the npm
# package node-llama-cpp bundles, writes a random-weight ~15M-parameter
# LLaMA-shaped GGUF model with llama.cpp's own gguf-py
# (scripts/random_gguf.py), starts two servers on 127.0.0.1 —
#
#   worker a: --parallel 4 -c 8192    worker b: --parallel 2 -c 4096
#   both:     -t 1 --metrics --slots --no-webui --cache-ram 0
#
# — measures their capacity, runs `sluice bench compare --workers` with
# the policies sluice and least-connections on them, and prints the
# summary table. The servers are stopped on exit.
#
# Not part of CI: the first run builds llama.cpp, which takes tens of
# minutes on two cores (39 under nice on a shared one); later runs reuse
# the build, the model and the package in the work directory. The answers of a random-weight model are
# noise and a CPU build's throughput says little about a GPU's; what is
# real is the engine's HTTP API: its telemetry, metric names, slots,
# errors and how it and Sluice's admission behave under load.
#
# Usage: scripts/real-llama-server.sh
#
# Environment (all optional):
#   SLUICE_REAL_LLAMA_DIR  work directory (default ${TMPDIR:-/tmp}/sluice-real-llama)
#   NODE_LLAMA_CPP_VERSION npm package whose llama.cpp to build (default 3.22.1)
#   PORT_A, PORT_B         loopback ports of the two servers (default 18081, 18082)
#   REQUESTS               requests per load and policy (default 120)
#   LOADS                  loads, percent of the measured capacity (default 50,90)
#   BURST                  also run the burst scenario: 1 or 0 (default 1)
#   JOBS                   build parallelism (default 2; the build runs under nice)
#   CAPTURE_DIR            if set, save the servers' real /health, /props,
#                          /slots, /metrics, /v1/models and one streamed chat
#                          completion there (idle, under load and after)
#   CAPTURE_PREFIX         prefix of the captured files' names (default none)
#   SLUICE_CONFIG          router config file (sluice serve format) passed to
#                          bench compare as --config: its admission, limits,
#                          weights, telemetry and stats settings are used, its
#                          workers and policy ignored (default none: the
#                          built-in defaults, admission.mode: limits)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${SLUICE_REAL_LLAMA_DIR:-${TMPDIR:-/tmp}/sluice-real-llama}
NODE_LLAMA_CPP_VERSION=${NODE_LLAMA_CPP_VERSION:-3.22.1}
PORT_A=${PORT_A:-18081}
PORT_B=${PORT_B:-18082}
REQUESTS=${REQUESTS:-120}
LOADS=${LOADS:-50,90}
BURST=${BURST:-1}
JOBS=${JOBS:-2}
CAPTURE_DIR=${CAPTURE_DIR:-}
CAPTURE_PREFIX=${CAPTURE_PREFIX:-}
SLUICE_CONFIG=${SLUICE_CONFIG:-}
HOST=127.0.0.1
MODEL_ALIAS="sluice-random-llama"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'real-llama-server: %s\n' "$*" >&2; exit 1; }

# --- tools ------------------------------------------------------------------

APT_UPDATED=
apt_install() {
	command -v apt-get >/dev/null || die "missing $*: install them (no apt-get here)"
	local sudo=
	[ "$(id -u)" = 0 ] || sudo=sudo
	if [ -z "$APT_UPDATED" ]; then
		$sudo apt-get update -qq
		APT_UPDATED=1
	fi
	log "installing $* (apt)"
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
command -v git >/dev/null || missing+=(git)
command -v curl >/dev/null || missing+=(curl)
command -v npm >/dev/null || missing+=(npm)
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
command -v go >/dev/null || die "go is needed to build Sluice"

# gguf-py needs numpy and PyYAML; Debian's python3 gets them from apt.
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import numpy, yaml' 2>/dev/null; then
	if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import numpy, yaml' 2>/dev/null; then
		PYTHON=/usr/bin/python3
	else
		apt_install python3 python3-numpy python3-yaml
		PYTHON=/usr/bin/python3
	fi
fi

# The config, made absolute before the cd below.
config=()
if [ -n "$SLUICE_CONFIG" ]; then
	[ -f "$SLUICE_CONFIG" ] || die "SLUICE_CONFIG: no file $SLUICE_CONFIG"
	SLUICE_CONFIG=$(cd "$(dirname "$SLUICE_CONFIG")" && pwd)/$(basename "$SLUICE_CONFIG")
	config=(--config "$SLUICE_CONFIG")
fi

mkdir -p "$WORK"
cd "$WORK"

# --- llama.cpp source from the npm package ------------------------------------

tgz=node-llama-cpp-$NODE_LLAMA_CPP_VERSION.tgz
if [ ! -f "$tgz" ]; then
	log "npm pack node-llama-cpp@$NODE_LLAMA_CPP_VERSION"
	npm pack --silent "node-llama-cpp@$NODE_LLAMA_CPP_VERSION" >/dev/null
fi
# One source tree and build at a time, for the version in the stamp.
src=$WORK/llama.cpp
build=$WORK/build
if [ "$(cat "$WORK/llama.cpp.version" 2>/dev/null)" != "$NODE_LLAMA_CPP_VERSION" ]; then
	log "extracting the bundled llama.cpp source"
	rm -rf package "$src" "$build" "$WORK/random-llama.gguf"
	tar xzf "$tgz" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json package/llama/binariesGithubRelease.json
	git clone -q package/llama/gitRelease.bundle "$src"
	echo "$NODE_LLAMA_CPP_VERSION" >"$WORK/llama.cpp.version"
fi
bundle_tag=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' package/llama/llama.cpp.info.json)
bundle_commit=$(git -C "$src" rev-parse HEAD)

# --- build llama-server --------------------------------------------------------

log "building llama-server (CPU, Release) in $build; the first build takes tens of minutes"
build_start=$(date +%s)
nice -n 19 cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
	-DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
	-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
	-DBUILD_SHARED_LIBS=OFF >"$WORK/cmake-configure.log" 2>&1
nice -n 19 cmake --build "$build" --target llama-server -j "$JOBS" >"$WORK/cmake-build.log" 2>&1
build_secs=$(($(date +%s) - build_start))
server=$build/bin/llama-server
[ -x "$server" ] || die "no $server after the build; see $WORK/cmake-build.log"
version=$("$server" --version 2>&1 | grep -m1 '^version' || true)
log "llama-server: ${version:-version unknown} (node-llama-cpp $NODE_LLAMA_CPP_VERSION, bundle tag $bundle_tag, commit $bundle_commit); build step ${build_secs}s"

# --- model ---------------------------------------------------------------------

model=$WORK/random-llama.gguf
if [ ! -f "$model" ]; then
	"$PYTHON" "$REPO/scripts/random_gguf.py" "$model" --gguf-py "$src/gguf-py" --seed 1
fi

# --- Sluice ----------------------------------------------------------------------

log "building sluice"
(cd "$REPO" && nice -n 19 go build -o "$WORK/sluice" ./cmd/sluice)
sluice=$WORK/sluice

# --- servers -----------------------------------------------------------------------

pids=()
cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

common=(-m "$model" --alias "$MODEL_ALIAS" --host "$HOST" -t 1 --metrics --slots --no-webui --cache-ram 0)
"$server" "${common[@]}" --port "$PORT_A" --parallel 4 -c 8192 >"$WORK/llama-a.log" 2>&1 &
pids+=($!)
"$server" "${common[@]}" --port "$PORT_B" --parallel 2 -c 4096 >"$WORK/llama-b.log" 2>&1 &
pids+=($!)
A=http://$HOST:$PORT_A
B=http://$HOST:$PORT_B

for url in "$A" "$B"; do
	for i in $(seq 1 240); do
		if curl -fsS -o /dev/null "$url/health" 2>/dev/null; then
			break
		fi
		for pid in "${pids[@]}"; do
			kill -0 "$pid" 2>/dev/null || die "a llama-server exited; see $WORK/llama-a.log and $WORK/llama-b.log"
		done
		[ "$i" -lt 240 ] || die "$url/health not ok after 120s"
		sleep 0.5
	done
done
log "both servers are up: a $A (4 slots, 8192 ctx), b $B (2 slots, 4096 ctx)"

# capture NAME: the servers' payloads into $CAPTURE_DIR, suffixed NAME.
capture() {
	[ -n "$CAPTURE_DIR" ] || return 0
	local w url
	for w in a b; do
		url=$A
		[ "$w" = b ] && url=$B
		curl -sS -o "$CAPTURE_DIR/${CAPTURE_PREFIX}$w-health-$1.json" "$url/health" || true
		curl -sS -o "$CAPTURE_DIR/${CAPTURE_PREFIX}$w-props-$1.json" "$url/props" || true
		curl -sS -o "$CAPTURE_DIR/${CAPTURE_PREFIX}$w-slots-$1.json" "$url/slots" || true
		curl -sS -o "$CAPTURE_DIR/${CAPTURE_PREFIX}$w-metrics-$1.txt" "$url/metrics" || true
	done
}
if [ -n "$CAPTURE_DIR" ]; then
	mkdir -p "$CAPTURE_DIR"
	capture idle
	curl -sS -o "$CAPTURE_DIR/${CAPTURE_PREFIX}a-models.json" "$A/v1/models"
	curl -sS -N -o "$CAPTURE_DIR/${CAPTURE_PREFIX}a-chat-stream.txt" "$A/v1/chat/completions" -H 'Content-Type: application/json' \
		-d '{"model":"'"$MODEL_ALIAS"'","messages":[{"role":"user","content":"Request 1. the router measures every worker"}],"max_tokens":8,"ignore_eos":true,"seed":1,"stream":true,"stream_options":{"include_usage":true}}'
	# A real refusal: a prompt longer than a slot of b (4096/2 tokens).
	"$PYTHON" -c 'import json; print(json.dumps({"model": "'"$MODEL_ALIAS"'", "max_tokens": 8, "messages": [{"role": "user", "content": "Request 2. " + "the router measures every worker " * 700}]}))' |
		curl -sS -o "$CAPTURE_DIR/${CAPTURE_PREFIX}b-chat-too-long.json" -w '%{http_code}\n' "$B/v1/chat/completions" \
			-H 'Content-Type: application/json' --data-binary @- >"$CAPTURE_DIR/${CAPTURE_PREFIX}b-chat-too-long.status" || true
fi

# --- load ------------------------------------------------------------------------------

# Lengths that fit a slot of either server (2,048 tokens each: 8192/4 and
# 4096/2): log-normal prompts of 32..1,200 and outputs of 16..400 tokens,
# as the length-only trace format (num_prefill_tokens, num_decode_tokens).
lengths=$WORK/lengths.csv
"$PYTHON" - "$lengths" <<'EOF'
import math, random, sys
rng = random.Random(7)
with open(sys.argv[1], "w") as f:
    f.write("num_prefill_tokens,num_decode_tokens\n")
    for _ in range(2000):
        p = min(1200, max(32, round(300 * math.exp(0.8 * rng.gauss(0, 1)))))
        o = min(400, max(16, round(80 * math.exp(0.8 * rng.gauss(0, 1)))))
        f.write("%d,%d\n" % (p, o))
EOF

# Capacity: both servers saturated at once, each sent three times its
# slots of the load's first requests at the same moment (bench run, not
# through Sluice); the sum of the completed requests per second is the
# fleet's capacity that --loads are percentages of.
log "measuring capacity: both servers saturated, directly"
measure() { # URL COUNT OUT
	"$sluice" bench run --target "$1" --model "$MODEL_ALIAS" --trace "$lengths" --format lengths \
		--rate 1000 --limit "$2" --timeout 10m --out "$3" >"$3.table" 2>"$3.log"
}
measure "$A" 12 "$WORK/capacity-a" &
ma=$!
measure "$B" 6 "$WORK/capacity-b" &
mb=$!
wait "$ma" || die "capacity run against a failed; see $WORK/capacity-a.log"
wait "$mb" || die "capacity run against b failed; see $WORK/capacity-b.log"
capacity=$("$PYTHON" - "$WORK/capacity-a/results.json" "$WORK/capacity-b/results.json" <<'EOF'
import json, sys
total = 0.0
for p in sys.argv[1:]:
    s = json.load(open(p))["summary"]
    if s["errors"]:
        sys.exit("%s: %d errors while measuring capacity" % (p, s["errors"]))
    total += s["requests_per_s"]
print("%.3f" % total)
EOF
)
log "capacity: $capacity req/s (a $(grep -o '"requests_per_s": *[0-9.]*' "$WORK/capacity-a/results.json" | grep -o '[0-9.]*$'), b $(grep -o '"requests_per_s": *[0-9.]*' "$WORK/capacity-b/results.json" | grep -o '[0-9.]*$'))"

# --- comparison --------------------------------------------------------------------------

burst=(--burst=false)
[ "$BURST" = 1 ] && burst=(--burst --burst-at 20s --burst-for 10s --burst-factor 4)
out=$WORK/compare
rm -rf "$out"
log "comparing sluice and least-connections: loads $LOADS% of $capacity req/s, $REQUESTS requests each$([ "$BURST" = 1 ] && echo ', and a burst')$([ -n "$SLUICE_CONFIG" ] && echo ", config $SLUICE_CONFIG")"
if [ -n "$CAPTURE_DIR" ]; then
	# Under load: the first moment in the first minutes of the run when
	# every slot of a is busy.
	(
		for _ in $(seq 1 300); do
			sleep 0.5
			busy=$(curl -sS "$A/metrics" 2>/dev/null | sed -n 's/^llamacpp:requests_processing \([0-9]*\).*/\1/p')
			if [ "${busy:-0}" -ge 4 ]; then
				capture load
				exit 0
			fi
		done
		capture load
	) &
	pids+=($!)
fi
"$sluice" bench compare --workers "a=$A,b=$B" --capacity "$capacity" \
	--trace "$lengths" --limit "$REQUESTS" --loads "$LOADS" "${burst[@]}" \
	--policies sluice,least-connections --timeout 5m ${config[@]+"${config[@]}"} --out "$out" >"$out.md" 2>"$WORK/compare.log" ||
	die "bench compare failed; see $WORK/compare.log"
capture after

cat "$out.md"
cat <<EOF

llama-server: ${version:-version unknown}
  node-llama-cpp $NODE_LLAMA_CPP_VERSION, bundle tag $bundle_tag, llama.cpp commit $bundle_commit
  CPU build (GGML_NATIVE=OFF), random-weight model $(basename "$model"), -t 1 per server
capacity measured: $capacity req/s$([ -n "$SLUICE_CONFIG" ] && printf '\nrouter config: %s' "$SLUICE_CONFIG")
reports: $out (summary.md, per-load report.md and CSVs); server logs: $WORK/llama-a.log, $WORK/llama-b.log
EOF
