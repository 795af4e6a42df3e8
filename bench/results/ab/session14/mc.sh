#!/bin/bash
# mc.sh MODS: rebuild the mypyc set in /work/wt_c
cd /work/wt_c && find . -name "*.so" -not -path "./.venv/*" -delete; rm -rf build
.venv/bin/python /tmp/runs/setup_mypyc.py build_ext --inplace --mods "$1" > /tmp/runs/mypyc2.log 2>&1; echo build rc=$?
timeout 600 .venv/bin/python -m pytest -m "not slow" -q -p no:cacheprovider -x tests/unit tests/protocol 2>&1 | tail -${2:-15}
