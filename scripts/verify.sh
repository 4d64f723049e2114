#!/usr/bin/env bash
# The main job: sets up .venv from nothing, then checks every op on every backend this machine
# has against float64 (`opforge verify`).
source "$(dirname "$0")/env.sh"
exec opforge verify "$@"
