#!/bin/sh
# qa-bench's setup: runs as the sandbox's root, after the bundle is unpacked into the working
# directory and before any command; once, in the work sandbox: what it leaves is kept as a setup
# image that the task sandboxes (and later runs of the same files) start from. The boundary is
# already in force: pip reaches the index through the run's proxy like any other connection (under
# catch-all routing the index host must be allowed in the vault). When setup ends, everything it
# started is killed and the commands run unprivileged.
set -eu

# A virtual environment: Debian's python3 refuses `pip install` into the system (PEP 668). In the
# working directory, because that is what every backend carries from setup to the commands: on
# sandbox0, setup runs in a container of its own and only the working directory is shared. With
# the system's site packages, so the task sees the work image's `requests`.
VENV="$PWD/.venv"
python3 -m venv --system-site-packages "$VENV"

# pip.conf names the index; requirements.txt pins the package by version and hash, so pip refuses
# any other bytes. pip trusts the run's CA through REQUESTS_CA_BUNDLE, which the sandbox's wiring sets.
PIP_CONFIG_FILE="$PWD/pip.conf" "$VENV/bin/pip" install --no-cache-dir --require-hashes -r requirements.txt

"$VENV/bin/python" -c 'import benchscore; print("benchscore", benchscore.__version__, "installed in", benchscore.__file__)'
