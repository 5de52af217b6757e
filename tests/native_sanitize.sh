#!/usr/bin/env bash
# Runs the table backends' differential tests (tests/test_table_backends.py) against
# psfleet's native core built with AddressSanitizer and UndefinedBehaviorSanitizer
# (issue 41). Usage, from anywhere, in the venv psfleet is installed in (editable):
#
#     bash tests/native_sanitize.sh [extra pytest arguments]
#
# It builds psfleet/ps/table/_core*.so in place with -fsanitize=address,undefined
# (-fno-sanitize-recover: any UB report fails the run), runs the tests with libasan
# and libstdc++ preloaded (the Python binary is not instrumented; without libstdc++
# first, ASan cannot intercept C++ throws), ASAN_OPTIONS=detect_leaks=0 (as
# CPython's own allocations would be reported at exit) and -s (a report must not
# vanish into pytest's capture), then builds the normal
# extension again, also when the tests fail. Exit status: pytest's. Needs g++ with libasan.
set -euo pipefail
cd "$(dirname "$0")/.."
restore() {  # the normal build (flags of setup.py), whatever was there before
  python setup.py -q build_ext --inplace --force >/dev/null
}
trap restore EXIT
PSFLEET_NATIVE_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined \
-fno-omit-frame-pointer -g" python setup.py -q build_ext --inplace --force >/dev/null
LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)" \
  ASAN_OPTIONS="detect_leaks=0" UBSAN_OPTIONS="print_stacktrace=1" \
  python -m pytest -q -s -p no:cacheprovider -n 0 tests/test_table_backends.py "$@"
