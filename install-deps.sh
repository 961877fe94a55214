#!/usr/bin/env bash
# Installs, from Debian's apt, whatever kvsim needs that this machine lacks (bookworm, as root).
#   ./install-deps.sh          what building, testing and the figures need
#   ./install-deps.sh fuzz     also clang (libFuzzer and its sanitizer runtimes), for tests/fuzz
#   ./install-deps.sh --list   installs nothing: prints the apt-get line of what is missing (for a
#                              user without root to hand to an administrator)
set -euo pipefail
packages=(
  build-essential cmake pkg-config
  libhdf5-dev hdf5-tools
  libxtensor-dev libxsimd-dev libxtensor-blas-dev libopenblas-dev
  libcli11-dev libboost-program-options-dev nlohmann-json3-dev
  libgtest-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  python3 python3-numpy python3-h5py python3-matplotlib python3-pandas python3-dev pybind11-dev
  python3-torch
  python3-pil dataset-fashion-mnist  # the assembled VLM (kvsim.vlm): image loading, its images
  python3-pip python3-venv python3-setuptools python3-wheel  # pip install . (pyproject.toml)
  python3-tqdm python3-nbclient python3-nbformat python3-ipykernel  # progress bars, the notebook
  qemu-user  # tests/run_on_old_cpu.sh: the default build must run on a CPU without AVX
)
[ "${1:-}" = fuzz ] && packages+=(clang)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${1:-}" = --list ]; then
  if ((${#missing[@]})); then
    echo "apt-get install --no-install-recommends ${missing[*]}"
  else
    echo "install-deps: nothing is missing"
  fi
  exit 0
fi
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
      echo "install-deps: not root and no sudo: ask an administrator to run" >&2
      echo "  apt-get install --no-install-recommends ${missing[*]}" >&2
      exit 1
    }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
