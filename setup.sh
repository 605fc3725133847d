#!/usr/bin/env bash
# Set up shufflefs on a fresh Debian/Ubuntu machine, then run the demo or the test suite.
#
#   bash setup.sh demo      # install, then mount a generated dataset and show two epochs
#   bash setup.sh test      # install, then run the full test suite (what CI runs)
#   bash setup.sh           # install only (the test extras: bash setup.sh test)
#
# Installs the system packages FUSE needs (fuse3, libfuse3-dev, pkg-config, attr; a C compiler
# and Python headers for building pyfuse3), creates .venv and installs shufflefs into it.
# Mounting FUSE filesystems and the tests need root (or sudo).
set -euo pipefail
cd "$(dirname "$0")"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: run as root or install sudo" >&2; exit 1; }
  SUDO="sudo"
fi

need=()
pkgs="fuse3 libfuse3-dev pkg-config attr gcc"
[ "${1:-}" = test ] && pkgs="$pkgs iproute2 strace"  # the tests' emulated wide-area link (ip, tc); tracing a daemon's own calls
for pkg in $pkgs; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null || ! "$PY" -c 'import venv, ensurepip, sysconfig, os; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then
  need+=(python3 python3-venv python3-dev)
  PY=python3
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup.sh: installing ${need[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if [ "${1:-}" = test ]; then
  # PyTorch first, pinned (TORCH_SPEC, default torch==2.13.0), so that the test extras do not pull
  # the newest release. On an ordinary Linux x86_64 machine pip's default index serves the CUDA
  # build (with several GB of CUDA packages); the tests need only the CPU build, which PyTorch
  # publishes on its own CPU wheel index: to install that one, point PIP_EXTRA_INDEX_URL (or
  # PIP_INDEX_URL) at it and, where its versions carry a local tag, TORCH_SPEC at one
  # (e.g. TORCH_SPEC='torch==2.13.0+cpu'). pip reads both from the environment.
  .venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==${TORCH_VERSION:-2.13.0}}"
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -e '.[test]'
else
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -e .
fi

# The compiled gather builds every window several times faster than the numpy fallback; the
# build is optional for pip, but not here: fail loudly rather than serve slowly.
if ! (py="$PWD/.venv/bin/python"; cd / && "$py" -c 'import shufflefs._gather') 2>/dev/null; then
  echo "setup.sh: the compiled gather module (shufflefs/_gather.c) was not built; install gcc and the" \
       "Python headers (python3-dev) and run setup.sh again" >&2
  exit 1
fi

case "${1:-}" in
  demo) shift; exec $SUDO .venv/bin/shufflefs demo "$@" ;;
  test) shift
    echo "setup.sh: running the tests (the full suite takes 25-45 min on 2 cores; 'bash setup.sh test --quick'" \
         "runs the tests that mount nothing, on one worker per CPU, in about 2 minutes)" >&2
    quick=()
    case " $* " in *" --quick "*) quick=(-n auto) ;; esac  # pytest-xdist, from the test extra
    start=$(date +%s); rc=0
    $SUDO .venv/bin/python -m pytest "${quick[@]}" "$@" || rc=$?
    echo "setup.sh: the tests took $(( $(date +%s) - start )) s" >&2
    exit $rc ;;
  "") echo "setup.sh: installed; activate with: source .venv/bin/activate" ;;
  *) echo "setup.sh: unknown command '$1' (use demo or test)" >&2; exit 2 ;;
esac
