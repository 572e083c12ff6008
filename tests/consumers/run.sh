#!/usr/bin/env bash
# Builds and runs one consumer project against the gmlake source tree SRC, in WORK
# (wiped first): each uses gmlake only through a front door.
#   meson      gmlake as a Meson subproject (a link in subprojects/); checks that
#              the subproject probes no CUDA and adds no -I/usr/include
#   pkgconfig  headers-only `meson install` into WORK/prefix, then the compiler
#              with `pkg-config --cflags gmlake` only (no -std flag of its own)
#   cmake      the same install, then find_package(gmlake CONFIG) in a CMake project
# Prints "1 passed, 0 failed" or "0 passed, 1 failed" last.
#   bash tests/consumers/run.sh meson|pkgconfig|cmake SRC WORK
set -uo pipefail
kind=${1:?usage: run.sh meson|pkgconfig|cmake SRC WORK} src=$(cd "${2:?}" && pwd) work=${3:?}
here=$src/tests/consumers
rm -rf "$work" && mkdir -p "$work" && work=$(cd "$work" && pwd)
log=$work/log

fail() { echo "consumer $kind: $1 (log: $log)"; tail -n 30 "$log"; echo "0 passed, 1 failed"; exit 1; }
run() { echo "+ $*" >>"$log"; "$@" >>"$log" 2>&1; }

install_headers() {  # the documented headers-only install
  run meson setup "$work/gmlake-build" "$src" --prefix="$work/prefix" \
      -Dtests=false -Dbench=false -Dexamples=false -Dcuda=disabled || fail "meson setup of gmlake failed"
  run meson install -C "$work/gmlake-build" || fail "meson install failed"
  local built
  built=$(find "$work/gmlake-build" -name '*.o' | wc -l)
  [[ $built -eq 0 ]] || fail "the headers-only install built $built objects"
}

case $kind in
  meson)
    cp -r "$here/meson-subproject" "$work/project" && cp "$here/consumer.cpp" "$work/project/"
    mkdir -p "$work/project/subprojects" && ln -s "$src" "$work/project/subprojects/gmlake"
    run meson setup "$work/build" "$work/project" || fail "meson setup failed"
    if grep -qE 'Cuda compiler|CUDA toolkit' "$log"; then fail "the subproject probed CUDA"; fi
    if grep -qE -- '-I/usr/include( |$)' "$work/build/build.ninja"; then fail "-I/usr/include reached the consumer"; fi
    run ninja -C "$work/build" || fail "build failed"
    exe=$work/build/consumer
    ;;
  pkgconfig)
    install_headers
    export PKG_CONFIG_PATH=$work/prefix/share/pkgconfig
    flags=$(pkg-config --cflags gmlake) || fail "pkg-config does not know gmlake"
    echo "pkg-config --cflags gmlake: $flags" >>"$log"
    # shellcheck disable=SC2086  # flags are words
    run "${CXX:-c++}" $flags "$here/consumer.cpp" -o "$work/consumer" $(pkg-config --libs gmlake) ||
      fail "compile with pkg-config's flags failed"
    exe=$work/consumer
    ;;
  cmake)
    install_headers
    gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
    run cmake "${gen[@]}" -S "$here/cmake" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" ||
      fail "cmake configure (find_package) failed"
    run cmake --build "$work/build" || fail "build failed"
    exe=$work/build/consumer
    ;;
  *) echo "unknown consumer: $kind" >&2; exit 2 ;;
esac

"$exe" 2>&1 | tee -a "$log"; rc=${PIPESTATUS[0]}
[[ $rc -eq 0 ]] || fail "the consumer exited with $rc"
echo "1 passed, 0 failed"
