#!/usr/bin/env bash
# Install a built wheel (with its test extra) into the current Python and run the test
# suite against it, from a directory where the source tree cannot shadow the wheel.
# Usage: scripts/test_wheel.sh path/to/kvpool-*.whl
set -euo pipefail
wheel=$(realpath "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
python -m pip install -q "${wheel}[test]"
# The same version may be installed already (pip would keep it): this wheel replaces it.
python -m pip install -q --force-reinstall --no-deps "${wheel}"
work=$(mktemp -d)
# The committed tree, without any built extension: the tests import the installed wheel
# (nothing puts python/ on sys.path); the stub and debug-build tests read the sources.
git -C "$root" archive --format=tar HEAD | tar -x -C "$work"
cd "$work"
python -c "import kvpool, sys; print('kvpool', kvpool.__version__, 'from', kvpool.__file__, 'on', sys.version.split()[0])"
# The vLLM and Dynamo tests need those packages (Linux, CPython 3.11 here); they skip without them.
python -m pytest -q -p no:cacheprovider tests
