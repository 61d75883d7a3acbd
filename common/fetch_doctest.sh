#!/usr/bin/env bash
# Makes sure Doctest's header is at INCLUDE_DIR/doctest/doctest.h, fetching it when INCLUDE_DIR
# is the repository's own .deps/doctest/include. Run by the build (common/deps.mk) before
# anything that includes Doctest is compiled; it installs nothing system-wide.
#
# usage: common/fetch_doctest.sh INCLUDE_DIR DEPS_INCLUDE_DIR
#   INCLUDE_DIR       where the build looks (DOCTEST_INCLUDE, else /usr/include when it has
#                     doctest/doctest.h, else DEPS_INCLUDE_DIR)
#   DEPS_INCLUDE_DIR  the git-ignored folder this script may fill (.deps/doctest/include)
# Ways to fetch, in order:
#   1. DOCTEST_URL=<url of doctest.h> (file://, http://, https://), checked against
#      DOCTEST_SHA256 (default: doctest 2.4.9's header, as Debian's doctest-dev 2.4.9~ds-1 ships it);
#   2. the Debian/Ubuntu package, downloaded and unpacked without installing it:
#      `apt-get download doctest-dev` (with a private package list when the system has none);
#      DOCTEST_APT=0 skips this way.
# Exit 0 when the header is in place (one line on stderr says where it came from, after the fact,
# so that a failure stays one line). Otherwise exit 1 and print on stdout
# one line: what is missing and the one command that installs it.
set -uo pipefail

include_dir=${1:?usage: fetch_doctest.sh INCLUDE_DIR DEPS_INCLUDE_DIR}
deps_include=${2:?usage: fetch_doctest.sh INCLUDE_DIR DEPS_INCLUDE_DIR}
PINNED_SHA256=041dced3b82ed2d6c920977fcba16e8b9e49daaa200c81ba0ccec529a4f1fd5d
INSTALL="sudo apt-get install doctest-dev"

[ -f "$include_dir/doctest/doctest.h" ] && exit 0
if [ "$include_dir" != "$deps_include" ]; then
    echo "DOCTEST_INCLUDE=$include_dir has no doctest/doctest.h: it must name the folder that holds doctest/doctest.h (e.g. /usr/include), or leave it unset and the build fetches Doctest itself"
    exit 1
fi

deps_dir=$(dirname "$deps_include")                # .deps/doctest
mkdir -p "$deps_dir" || { echo "cannot create $deps_dir; install Doctest with: $INSTALL"; exit 1; }
work=$(mktemp -d "$deps_dir/.fetch-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
log=$deps_dir/fetch.log
: >"$log"

# Puts HEADER into place with a rename, so that builds running side by side never read half a file.
install_header() {
    mkdir -p "$deps_include/doctest" &&
        cp "$1" "$deps_include/doctest/.doctest.h.$$" &&
        mv -f "$deps_include/doctest/.doctest.h.$$" "$deps_include/doctest/doctest.h"
}

if [ -n "${DOCTEST_URL:-}" ]; then
    expected=${DOCTEST_SHA256:-$PINNED_SHA256}
    if ! python3 - "$DOCTEST_URL" "$work/doctest.h" >>"$log" 2>&1 <<'EOF'
import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=30) as response, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(response, out)
EOF
    then
        echo "could not download Doctest from DOCTEST_URL=$DOCTEST_URL (see $log); install it with: $INSTALL"
        exit 1
    fi
    actual=$(sha256sum "$work/doctest.h" | cut -d' ' -f1)
    if [ "$actual" != "$expected" ]; then
        echo "the file at DOCTEST_URL=$DOCTEST_URL has sha256 $actual, not the pinned $expected (DOCTEST_SHA256): refused; install Doctest with: $INSTALL"
        exit 1
    fi
    install_header "$work/doctest.h" || { echo "cannot write $deps_include; install Doctest with: $INSTALL"; exit 1; }
    echo "Doctest: $DOCTEST_URL (sha256 checked) -> $deps_include/doctest/doctest.h" >&2
    exit 0
fi

if [ "${DOCTEST_APT:-1}" != 0 ] && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
    fetched=0
    sandbox=(-o APT::Sandbox::User="$(id -un)")
    if (cd "$work" && apt-get "${sandbox[@]}" download doctest-dev) >>"$log" 2>&1; then
        fetched=1
    else
        # No package list on this system (a fresh container): read one into a private folder.
        private=("${sandbox[@]}" -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache"
                 -o Debug::NoLocking=1)
        mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
        if apt-get "${private[@]}" update >>"$log" 2>&1 &&
            (cd "$work" && apt-get "${private[@]}" download doctest-dev) >>"$log" 2>&1; then
            fetched=1
        fi
    fi
    if [ $fetched = 1 ]; then
        deb=$(ls "$work"/doctest-dev_*.deb 2>/dev/null | head -n 1)
        if [ -n "$deb" ] && dpkg-deb -x "$deb" "$work/unpacked" >>"$log" 2>&1 &&
            [ -f "$work/unpacked/usr/include/doctest/doctest.h" ] &&
            install_header "$work/unpacked/usr/include/doctest/doctest.h"; then
            echo "Doctest: fetched $(basename "$deb") (apt-get download; nothing installed) -> $deps_include/doctest/doctest.h" >&2
            exit 0
        fi
    fi
fi

echo "Doctest is not installed and could not be fetched (see $log); install it with: $INSTALL"
exit 1
