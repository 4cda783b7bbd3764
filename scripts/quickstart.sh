#!/usr/bin/env bash
# The main job from a fresh clone: set up the environment, fetch the default model pair, export the bundle
# (once; later runs reuse it) and run a speculative generation next to the target alone.
#   ./scripts/quickstart.sh [edgespec quickstart options...]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/setup-env.sh"
exec edgespec quickstart "$@"
