#!/bin/bash
# test/tle/build.sh: build pg_tle once, for the SQL edition's test through
# pg_tle (test/t/091_sql_edition_tle.pl), the stand-in for a managed
# service.
#
# From ../shared/vendor/pg_tle-*.tar.gz (or $IDEM_TEST_TLE_TARBALL), for
# the server of $PG_CONFIG, into
#   $IDEM_TEST_TLE_CACHE (default /var/tmp/idem-pgtle/<major>)/root/...
# with a stamp naming the source and the server; a second run with the same
# stamp does nothing.  As root (it installs flex, bison and libkrb5-dev):
#   bash test/tle/build.sh
# It exits 0 when pg_tle is ready, 2 when there is no source here, 1 when
# the build failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib.sh
pg_dirs

if ! tle_locate; then
	say "pg_tle: no source (looked for $TLE_TARBALL_GLOB)"
	exit 2
fi
stamp="$(basename "$TLE_TARBALL") $(sha256sum "$TLE_TARBALL" | cut -c1-16) $($PG_CONFIG --version)"
if [ -f "$TLE_CACHE/stamp" ] && [ "$(cat "$TLE_CACHE/stamp")" = "$stamp" ]; then
	exit 0
fi
if ! is_root; then
	say "pg_tle: building needs root: sudo bash test/tle/build.sh"
	exit 1
fi

missing=()
for p in $TLE_PACKAGES; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' ||
		missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	say "pg_tle: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends "${missing[@]}" >/dev/null || exit 1
fi

say "pg_tle: building $(basename "$TLE_TARBALL") for PostgreSQL $PG_MAJOR into $TLE_CACHE"
start=$SECONDS
work=$(mktemp -d /var/tmp/idem-pgtle-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=$work/build.log
if tar -xzf "$TLE_TARBALL" -C "$work" &&
	src=$(ls -d "$work"/pg_tle-*/) &&
	(cd "$src" &&
		make PG_CONFIG="$PG_CONFIG" with_llvm=no &&
		make install PG_CONFIG="$PG_CONFIG" with_llvm=no DESTDIR="$work/root") >"$log" 2>&1; then
	rm -rf "$TLE_CACHE"
	mkdir -p "$TLE_CACHE"
	mv "$work/root" "$TLE_CACHE/root"
	echo "$stamp" >"$TLE_CACHE/stamp"
	chmod -R a+rX "$(dirname "$TLE_CACHE")"
	say "pg_tle: built in $((SECONDS - start)) s"
else
	tail -n 40 "$log"
	say "pg_tle: build failed"
	exit 1
fi
