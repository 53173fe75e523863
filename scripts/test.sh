#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every check and test.
#
#   scripts/test.sh
#
# - Python tools into .venv (moto's S3 server, boto3, the aws cli, s5cmd, pytest, hypothesis). Tests start their own S3 servers on loopback
#   from there, one per test, on free ports; nothing is left running afterwards.
# - cargo fmt --check, cargo clippy -D warnings, a check of the feature-gated backends, and the whole
#   workspace's tests, then the Python tests of the S3 gateway against the binary those tests built.
# Safe to run again: the venv is reused when it already has everything.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n==> %s\n' "$*"; }

if ! .venv/bin/python -c 'import moto, boto3, s5cmd, awscli, pytest, hypothesis' 2>/dev/null; then
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

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

say "cargo check: GCS and Azure backends (behind features)"
cargo check -p strata-object --features gcp,azure --locked

say "cargo test"
cargo test --workspace --locked

say "gateway tests with real S3 clients (pytest: boto3, aws cli, s5cmd)"
STRATA_BIN="$PWD/target/debug/strata" .venv/bin/python -m pytest -q tests/python

say "all tests passed"
