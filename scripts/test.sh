#!/usr/bin/env bash
# The test suite, exactly as CI runs it: system packages (as root), the venv, the real models the slow tests
# need (fetched by edgespec's own `pull`), then pytest over everything, slow tests included.
#   ./scripts/test.sh [pytest args...]        e.g. ./scripts/test.sh -m "not slow"
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
"$ROOT/scripts/system-deps.sh"
source "$ROOT/scripts/setup-env.sh"
exec python -m pytest "$@"
