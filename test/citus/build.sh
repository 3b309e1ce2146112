#!/usr/bin/env bash
# test/citus/build.sh: build Citus once, for the citus suite of make test.
#
# Citus is a test dependency only (idem neither links with it nor ships
# it), and no package registry reachable from CI provides it, so it is
# built from the source tarball beside the checkout
# (../shared/vendor/citus-*.tar.gz, or $IDEM_TEST_CITUS_TARBALL: the newest
# that supports the major, by its configure script, so 13.2 for 15 and 14.0
# for 16 to 18) into a cache directory per PostgreSQL major, never into the
# system's PostgreSQL:
#   $IDEM_TEST_CITUS_CACHE (default /var/tmp/idem-citus/<major>)/root/...
# mirrors the installation's paths; test/run.sh copies it into its private
# installation (tmp_install/).  A stamp records which tarball and which
# server it was built for (name, checksum, server version), so a rebuild
# happens only when either changes.
#
# Needs root (it installs the -dev packages whose link flags PGXS passes
# on).  test/run.sh calls it as root; run it by hand as root with
#   bash test/citus/build.sh
# It exits 0 when Citus is ready, 2 when it cannot be built here (no
# tarball, an unsupported major), 1 when the build failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib.sh
pg_dirs

if ! citus_locate; then
	say "citus: $CITUS_SKIP (looked for ${CITUS_TARBALL_GLOB})"
	exit 2
fi
# the stamp: which source (by checksum) for which server
stamp="$(basename "$CITUS_TARBALL") $(sha256sum "$CITUS_TARBALL" | cut -c1-16) $($PG_CONFIG --version)"
if [ -f "$CITUS_CACHE/stamp" ] && [ "$(cat "$CITUS_CACHE/stamp")" = "$stamp" ]; then
	exit 0
fi
if ! is_root; then
	say "citus: building needs root: sudo bash test/citus/build.sh"
	exit 1
fi

missing=()
for p in $CITUS_PACKAGES; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' ||
		missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	say "citus: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends "${missing[@]}" >/dev/null || exit 1
fi

# Citus's statistics collection compiles where HAVE_LIBCURL is defined,
# and the server's own pg_config.h defines it when the server was built
# with libcurl (Debian's 18): then Citus is built with libcurl too, else
# without.  The suites turn the collection off
# (citus.enable_statistics_collection): a test server calls out to nobody.
curl=--without-libcurl
grep -qs '^#define HAVE_LIBCURL 1' "$($PG_CONFIG --includedir-server)/pg_config.h" && curl=
say "citus: building $(basename "$CITUS_TARBALL") for PostgreSQL $PG_MAJOR into $CITUS_CACHE"
start=$SECONDS
work=$(mktemp -d /var/tmp/idem-citus-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=$work/build.log
if tar -xzf "$CITUS_TARBALL" -C "$work" &&
	src=$(ls -d "$work"/citus-*/) &&
	(cd "$src" &&
		./configure $curl PG_CONFIG="$PG_CONFIG" &&
		make -j"$(nproc)" with_llvm=no &&
		make install with_llvm=no DESTDIR="$work/root") >"$log" 2>&1; then
	rm -rf "$CITUS_CACHE"
	mkdir -p "$CITUS_CACHE"
	mv "$work/root" "$CITUS_CACHE/root"
	echo "$stamp" >"$CITUS_CACHE/stamp"
	chmod -R a+rX "$(dirname "$CITUS_CACHE")"
	say "citus: built in $((SECONDS - start)) s"
else
	tail -n 40 "$log"
	say "citus: build failed"
	exit 1
fi
