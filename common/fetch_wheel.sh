#!/usr/bin/env bash
# Sourced by common/fetch_cuobjdump.sh and common/fetch_nccl.sh, which fetch NVIDIA's tools and
# libraries from PyPI the way the build fetches Doctest: one pinned wheel downloaded (pip
# download: nothing installed), its sha256 checked, its files unpacked.
#
# fetch_wheel PACKAGE VERSION SHA256 WORK LOG WHAT
#   downloads PACKAGE==VERSION's wheel into WORK/PACKAGE and unpacks it into WORK/unpacked (which
#   may already hold another wheel's files); pip's and the unpacking's output go to LOG. On
#   success FETCHED_WHEEL names the wheel's file. On failure it prints one line, ending with how
#   to install WHAT instead ($INSTALL, set by the caller), and returns 1.
fetch_wheel() {
    local package=$1 version=$2 sha256=$3 work=$4 log=$5 what=$6 wheel actual
    if ! python3 -m pip download --quiet --no-deps --only-binary=:all: "$package==$version" \
            -d "$work/$package" >>"$log" 2>&1; then
        echo "could not download $package $version (see $log); install $what with: $INSTALL"
        return 1
    fi
    wheel=$(ls "$work/$package"/*.whl 2>/dev/null | head -n 1)
    actual=$(sha256sum "$wheel" | cut -d' ' -f1)
    if [ "$actual" != "$sha256" ]; then
        echo "the downloaded $(basename "$wheel") has sha256 $actual, not the pinned $sha256: refused; install $what with: $INSTALL"
        return 1
    fi
    python3 -m zipfile -e "$wheel" "$work/unpacked" >>"$log" 2>&1 ||
        { echo "could not unpack $(basename "$wheel"); install $what with: $INSTALL"; return 1; }
    FETCHED_WHEEL=$(basename "$wheel")
}
