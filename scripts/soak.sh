#!/usr/bin/env bash
# Churn soak for mcs-client (issue #8): concurrent requests through the layer to real HTTP
# servers on 127.91.x.y / 127.92.x.y while endpoints are added, removed, made unready,
# killed (connections refused), reset and answering 503, thousands of times; compared with
# the same load without churn. See mcs-client/benches/churn_soak.rs for what is measured.
#
#   scripts/soak.sh                       # 60 s per phase, 32 workers, 2000 req/s offered
#   scripts/soak.sh --duration 5m         # longer
#   scripts/soak.sh --rate 0              # closed loop (as fast as the machine goes)
#   scripts/soak.sh --workers 64 --servers 16 --churn-every 10ms --max-failing 2
#
# Arguments are passed to the bench binary (--duration, --workers, --rate, --servers,
# --churn-every, --max-failing, --drain, ...; `scripts/soak.sh --help` lists them all);
# durations as 500ms, 1.5s, 60s or 5m; MCS_SOAK_DURATION, MCS_SOAK_WORKERS and
# MCS_SOAK_RATE set defaults. It prints two markdown tables (both phases) and the churn
# event counts, and exits non-zero if any request failed with a transport error or got
# stuck. It takes two phases of the given duration plus the build (release profile).
# Needs Linux (all of 127.0.0.0/8 on loopback; /proc for descriptor counts).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$#" -eq 0 ]; then
	set -- --duration 60s --workers 32
fi
exec cargo bench -p mcs-client --bench churn_soak -- "$@"
