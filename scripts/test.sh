#!/usr/bin/env bash
# The test command: sets up .venv from nothing, then runs the whole suite, then every docstring
# example. With no GPU the Triton kernels run in Triton's interpreter and the Metal kernels in
# the MSL emulator.
source "$(dirname "$0")/env.sh"
python -m pytest -q -rs "$@"
python -m pytest -q -p no:cacheprovider --doctest-modules src/opforge
