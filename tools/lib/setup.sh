# Shared by tools/quickstart and tools/check: install what is missing, then
# configure and build. Sourced, not run.

# cd's output to /dev/null: with CDPATH set it prints the directory too.
RLSYNC_ROOT=$(cd -- "$(dirname "${BASH_SOURCE[0]}")/../.." >/dev/null && pwd)
RLSYNC_BUILD=${RLSYNC_BUILD:-$RLSYNC_ROOT/build}
# A relative RLSYNC_BUILD is the caller's directory's; make it absolute before
# a script cds elsewhere (tools/quickstart into the checkout).
case $RLSYNC_BUILD in /*) ;; *) RLSYNC_BUILD=$PWD/$RLSYNC_BUILD ;; esac

# Debian packages rlsync builds and tests with. CUDA and NCCL come from
# /usr/local/cuda when present; without them gpu/ builds its stubs.
RLSYNC_PACKAGES=(
  cmake ninja-build g++ pkg-config ccache
  libcaf-dev libucx-dev ucx-utils libyaml-cpp-dev doctest-dev libssl-dev
  libxxhash-dev nlohmann-json3-dev libcli11-dev libboost-dev
  iproute2
  curl python3-requests # rlsync serve's client-sequence tests
  python3-dev pybind11-dev python3-torch # the rlsync Python module, its example and tests
  openmpi-bin libopenmpi-dev # rlsync-mpi-bcast: bench sync's MPI_Bcast baseline
  valgrind # tools/fleet-instructions: a sync round's instructions per engine
)
# Commands whose Debian package is installed only when the command is missing:
# NodeSource's nodejs carries its own npm and conflicts with Debian's.
RLSYNC_COMMANDS=(
  npm:npm # the openai npm package's client test of /v1/completions
)

rlsync_install_missing() {
  local missing=()
  for p in "${RLSYNC_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  for c in "${RLSYNC_COMMANDS[@]}"; do
    command -v "${c%%:*}" > /dev/null || missing+=("${c#*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "rlsync: installing missing packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  # Through env: sudo's env_reset would drop an assignment before it.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

rlsync_build() {
  local cuda_args=()
  if [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    cuda_args+=("-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc")
  fi
  if [ ! -f "$RLSYNC_BUILD/build.ninja" ]; then
    cmake -S "$RLSYNC_ROOT" -B "$RLSYNC_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      "${cuda_args[@]}" >/dev/null
  fi
  # Paths relative to the checkout in ccache's keys: a fresh clone anywhere
  # (CI's, a second worktree) reuses what an earlier build compiled.
  CCACHE_BASEDIR=${CCACHE_BASEDIR:-$RLSYNC_ROOT} cmake --build "$RLSYNC_BUILD" -- -j"$(nproc)"
}
