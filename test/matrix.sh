#!/usr/bin/env bash
# test/matrix.sh: "make test-matrix".  Builds idem and runs its whole test
# suite ("make test") against other PostgreSQL majors, each inside a Debian
# chroot that holds only Debian's own packages of that major:
#
#   major  Debian suite
#   15     bookworm
#   16     trixie, the server built from ../shared/vendor/postgresql-16.*
#   17     trixie
#   18     sid
#   19     sid, with the server from experimental (release candidate)
#
# No Debian suite ships 16, so its server is built inside the trixie chroot
# from the vendored source tree (configure --enable-tap-tests; the
# isolation tester and the TAP modules installed where PGXS finds them),
# into /opt/postgresql-16 there, once: a stamp holds the tarball's
# checksum and the build's flags, and a new tarball means a new build
# (about 3 minutes here).  It is built with DISCARD_CACHES_ENABLED, so that
# debug_discard_caches can be set (test/t/023_binding_discard.pl, which
# Debian's builds skip); that costs nothing while it is 0.
# The Citus tarballs of ../shared/vendor are copied in, so that the Citus
# suite runs on every major a vendored Citus supports (test/citus/build.sh
# picks the newest that does, and caches its build in the chroot); a major
# that none supports says so on its line.  Usage, as root:
#
#   make test-matrix PG_MAJORS="16 17 18 19"
#
# The chroots live under $IDEM_MATRIX_DIR (/var/tmp/idem-matrix) and are
# kept: the first run of a suite debootstraps it and installs the packages
# (about 1.5 minutes each here), later runs reuse it.  Each chroot takes
# about 2 GB.  Where Debian has no pgTAP package for a major (16, 19),
# pgTAP's SQL files come from a neighbouring major's package.  The tree is copied in as git sees it
# (tracked files and untracked ones that are not ignored), so uncommitted
# changes are tested.  It ends with one line per major:
#
#   pg17: build ok, 753 passed, 0 failed, 0 skipped, Citus 14.0.1 (212 s)
#   pg19: build ok, 715 passed, 0 failed, 1 skipped (citus: no Citus
#         release here supports PostgreSQL 19) (160 s)
#
# and exits non-zero if a build or a test failed.  Logs stay in
# $IDEM_MATRIX_DIR/logs.  The suite selectors of test/run.sh
# (IDEM_TEST_SUITES, IDEM_TEST_REGRESS, IDEM_TEST_ISOLATION, IDEM_TEST_TAP)
# are passed in, to run a part of the suite on every major.  The SQL
# edition's isolation specs and its HTTP and client suites run once, in
# "make test" on the machine's 15 (IDEM_TEST_EXCEPT="sql-isolation
# sql-clients" here unless it or IDEM_TEST_SUITES is set); the chroots have no pg_tle source, so its
# suites through pg_tle say that they skip, and TAP 090 (its plain script)
# runs on every major.
set -uo pipefail
cd "$(dirname "$0")/.."

MIRROR=${IDEM_MATRIX_MIRROR:-http://deb.debian.org/debian}
ROOT=${IDEM_MATRIX_DIR:-/var/tmp/idem-matrix}
MAJORS=${PG_MAJORS:-17 18 19}
[ -n "${IDEM_TEST_SUITES:-}" ] || IDEM_TEST_EXCEPT=${IDEM_TEST_EXCEPT-sql-isolation sql-clients}
CFLAGS=${IDEM_CFLAGS:--Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wformat-nonliteral -Werror}
# sid's and experimental's Release files may be past their Valid-Until
APT="apt-get -q -y --no-install-recommends -o Acquire::Check-Valid-Until=false -o Dpkg::Use-Pty=0"

say() { printf 'matrix: %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
	say "needs root (debootstrap, chroot, mount); run it as root or with sudo"
	exit 2
fi
mkdir -p "$ROOT/logs"
if ! command -v debootstrap >/dev/null; then
	say "installing debootstrap"
	DEBIAN_FRONTEND=noninteractive apt-get -qq update &&
		DEBIAN_FRONTEND=noninteractive apt-get -qq -y install debootstrap >/dev/null ||
		{ say "cannot install debootstrap"; exit 2; }
fi

suite_of() {
	case $1 in
	15) echo bookworm ;;
	16 | 17) echo trixie ;;
	18 | 19) echo sid ;;
	*) return 1 ;;
	esac
}

VENDOR=$PWD/../shared/vendor
CITUS_PACKAGES=$(PG_MAJOR=0 bash -c '. test/lib.sh && echo $CITUS_PACKAGES')
# the vendored source tree of a major no Debian suite ships, if any
source_of() {
	ls "$VENDOR"/postgresql-"$1".*.tar.* 2>/dev/null | sort -V | tail -n 1
}

# pg_config_of SUITE_DIR MAJOR: the major's pg_config inside the chroot
pg_config_of() {
	if [ -n "$(source_of "$2")" ]; then
		echo "/opt/postgresql-$2/bin/pg_config"
	else
		echo "/usr/lib/postgresql/$2/bin/pg_config"
	fi
}

# run a command inside chroot $1 with a clean environment
inside() {
	local dir=$1
	shift
	chroot "$dir" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		DEBIAN_FRONTEND=noninteractive "$@"
}

MOUNTS=()
unmount_all() {
	local m
	for m in "${MOUNTS[@]}"; do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
	done
	MOUNTS=()
}
trap unmount_all EXIT

# /proc and a /dev/shm for the servers' shared memory
mount_in() {
	local dir=$1
	if ! mountpoint -q "$dir/proc"; then
		mount -t proc proc "$dir/proc" && MOUNTS+=("$dir/proc")
	fi
	mkdir -p "$dir/dev/shm"
	if ! mountpoint -q "$dir/dev/shm"; then
		mount -t tmpfs -o mode=1777,size=1g idem-shm "$dir/dev/shm" &&
			MOUNTS+=("$dir/dev/shm")
	fi
}

# prepare SUITE MAJOR: the suite's chroot, with major's server, headers and
# the test tools in it.  Each step leaves a marker file, so that a run that
# was interrupted resumes where it stopped.
prepare() {
	local suite=$1 major=$2 dir=$ROOT/$1
	if [ ! -e "$dir/.idem-base" ]; then
		say "pg$major: debootstrap $suite"
		rm -rf "$dir"
		debootstrap --variant=minbase --include=ca-certificates \
			"$suite" "$dir" "$MIRROR" || return 1
		# packages start no service, and create no cluster
		printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
		chmod 755 "$dir/usr/sbin/policy-rc.d"
		mkdir -p "$dir/etc/postgresql-common"
		echo 'create_main_cluster = false' >"$dir/etc/postgresql-common/createcluster.conf"
		touch "$dir/.idem-base"
	fi
	# the host's own trusted CAs (a TLS proxy in front of the npm registry)
	local ca
	for ca in /usr/local/share/ca-certificates/*.crt; do
		[ -f "$ca" ] || continue
		cmp -s "$ca" "$dir/usr/local/share/ca-certificates/${ca##*/}" && continue
		cp "$ca" "$dir/usr/local/share/ca-certificates/" &&
			inside "$dir" update-ca-certificates >/dev/null
	done
	mount_in "$dir"

	local from=()
	if [ "$major" = 19 ]; then
		from=(-t experimental)
		if [ ! -e "$dir/etc/apt/sources.list.d/experimental.list" ]; then
			printf 'deb %s experimental main\n' "$MIRROR" >"$dir/etc/apt/sources.list.d/experimental.list"
		fi
	fi
	local src
	src=$(source_of "$major")
	if [ -n "$src" ]; then
		build_source "$dir" "$major" "$src" || return 1
	elif [ ! -e "$dir/.idem-pg$major" ]; then
		say "pg$major: installing PostgreSQL $major and the test tools in $suite"
		inside "$dir" sh -c "$APT update && $APT install make gcc libc6-dev \
			libtap-parser-sourcehandler-pgtap-perl libipc-run-perl \
			nodejs npm pgbouncer postgresql-common" || return 1
		inside "$dir" $APT "${from[@]}" install \
			"postgresql-$major" "postgresql-server-dev-$major" || return 1
		if ! inside "$dir" $APT "${from[@]}" install "postgresql-$major-pgtap"; then
			# pgTAP is SQL only: the previous major's package files serve
			say "pg$major: Debian has no postgresql-$major-pgtap; using postgresql-$((major - 1))-pgtap's files"
			inside "$dir" sh -c "set -e; rm -rf /build/pgtap && mkdir -p /build/pgtap && cd /build/pgtap
				apt-get -q -o Acquire::Check-Valid-Until=false download postgresql-$((major - 1))-pgtap
				dpkg-deb -x postgresql-*-pgtap_*.deb x
				cp x/usr/share/postgresql/$((major - 1))/extension/pgtap* /usr/share/postgresql/$major/extension/
				cd / && rm -rf /build/pgtap" || return 1
		fi
		inside "$dir" apt-get clean
		touch "$dir/.idem-pg$major"
	fi
	# what a Citus build needs (test/lib.sh's list), installed here
	# with the options that sid's and experimental's stale Release files
	# need, so that test/citus/build.sh finds it all in place
	if [ "$(cat "$dir/.idem-citus-dev" 2>/dev/null)" != "$CITUS_PACKAGES" ]; then
		inside "$dir" sh -c "$APT update && $APT install $CITUS_PACKAGES" || return 1
		inside "$dir" apt-get clean
		echo "$CITUS_PACKAGES" >"$dir/.idem-citus-dev"
	fi
	# the Citus sources, for the Citus suite (test/citus/build.sh)
	mkdir -p "$dir/build/shared/vendor"
	local t
	for t in "$VENDOR"/citus-*.tar.gz; do
		[ -f "$t" ] || continue
		cmp -s "$t" "$dir/build/shared/vendor/${t##*/}" || cp "$t" "$dir/build/shared/vendor/"
	done
}

# build_source DIR MAJOR TARBALL: PostgreSQL MAJOR built from TARBALL into
# /opt/postgresql-MAJOR of the chroot DIR, with what the suites need beside
# the server: the isolation tester and the TAP modules (PGXS finds both
# under lib/pgxs/src/test), and pgTAP's SQL files from the neighbouring
# major's Debian package.  Skipped when the stamp names this tarball's
# checksum and these flags.
build_source() {
	local dir=$1 major=$2 tarball=$3 prefix=/opt/postgresql-$2 sum
	local cppflags=-DDISCARD_CACHES_ENABLED
	sum="$(sha256sum "$tarball" | cut -d' ' -f1) $cppflags"
	if [ -f "$dir$prefix/.idem-source" ] && [ "$(cat "$dir$prefix/.idem-source")" = "$sum" ]; then
		return 0
	fi
	say "pg$major: building $(basename "$tarball") into $prefix in the chroot"
	inside "$dir" sh -c "$APT update && $APT install make gcc libc6-dev \
		bison flex pkg-config zlib1g-dev perl \
		libtap-parser-sourcehandler-pgtap-perl libipc-run-perl \
		nodejs npm pgbouncer postgresql-common" || return 1
	rm -rf "$dir/build/pgsrc" "$dir$prefix"
	mkdir -p "$dir/build/pgsrc"
	tar -xf "$tarball" -C "$dir/build/pgsrc" || return 1
	local t0=$SECONDS
	inside "$dir" sh -c "set -e; cd /build/pgsrc/postgresql-*/
		./configure --prefix=$prefix --enable-tap-tests --without-readline --without-icu \
			CPPFLAGS='$cppflags'
		make -j$(nproc) && make install
		make -C src/test/isolation install && make -C src/test/perl install" || return 1
	say "pg$major: built in $((SECONDS - t0)) s"
	local near=$((major + 1)) share
	share=$(inside "$dir" "$prefix/bin/pg_config" --sharedir)
	inside "$dir" sh -c "set -e; rm -rf /build/pgtap && mkdir -p /build/pgtap && cd /build/pgtap
		apt-get -q -o Acquire::Check-Valid-Until=false download postgresql-$near-pgtap
		dpkg-deb -x postgresql-*-pgtap_*.deb x
		cp x/usr/share/postgresql/$near/extension/pgtap* $share/extension/
		cd / && rm -rf /build/pgtap" || return 1
	rm -rf "$dir/build/pgsrc"
	inside "$dir" apt-get clean
	echo "$sum" >"$dir$prefix/.idem-source"
}

summary=()
status=0
port=57300
for major in $MAJORS; do
	t0=$(date +%s)
	log=$ROOT/logs/pg$major
	if ! suite=$(suite_of "$major"); then
		summary+=("pg$major: build FAILED, 0 passed, 1 failed (no Debian suite ships PostgreSQL $major)")
		status=1
		continue
	fi
	dir=$ROOT/$suite
	if ! prepare "$suite" "$major" >"$log-setup.log" 2>&1; then
		tail -n 20 "$log-setup.log"
		summary+=("pg$major: build FAILED, 0 passed, 1 failed (setting up $suite failed: $log-setup.log)")
		status=1
		unmount_all
		continue
	fi
	pg_config=$(pg_config_of "$dir" "$major")
	say "pg$major: $(inside "$dir" "$pg_config" --version) from $suite"

	work=/build/idem
	rm -rf "$dir$work"
	mkdir -p "$dir$work"
	git ls-files -z -co --exclude-standard |
		xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
		tar --null -T - -cf - | tar -C "$dir$work" -xf -

	# the build, with CI's warning flags
	if inside "$dir" sh -c "cd $work && make -s PG_CONFIG=$pg_config PG_CFLAGS='$CFLAGS'" \
		>"$log-build.log" 2>&1; then
		build=ok
	else
		build=FAILED
		status=1
		cat "$log-build.log"
	fi

	result="0 passed, 1 failed (not run)"
	selectors=
	for v in IDEM_TEST_SUITES IDEM_TEST_EXCEPT IDEM_TEST_REGRESS IDEM_TEST_ISOLATION \
		IDEM_TEST_TAP IDEM_TEST_CITUS IDEM_TEST_REQUIRE_CITUS; do
		[ -n "${!v:-}" ] && selectors+="$v='${!v}' "
	done
	if [ $build = ok ]; then
		port=$((port + 1))
		inside "$dir" sh -c "cd $work && make -s clean PG_CONFIG=$pg_config >/dev/null &&
			IDEM_TEST_PORT=$port $selectors make test PG_CONFIG=$pg_config IDEM_CFLAGS='$CFLAGS'" \
			>"$log-test.log" 2>&1
		rc=$?
		if line=$(grep -E '^idem: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$log-test.log" | tail -n 1); then
			result=${line#idem: }
		fi
		# the Citus tested, from the citus suite's own line
		if citus=$(grep -oE '^idem: citus: citus-[0-9.]+\.tar\.gz' "$log-test.log" | tail -n 1); then
			citus=${citus#idem: citus: citus-}
			result+=", Citus ${citus%.tar.gz}"
		fi
		if [ $rc != 0 ] || [[ $result != *" 0 failed,"* ]]; then
			status=1
			grep -E 'FAILED|^not ok|Failed test|Dubious|failed$' "$log-test.log" | head -n 30
		fi
	fi
	rm -rf "${dir:?}$work"
	unmount_all
	summary+=("pg$major: build $build, $result ($(($(date +%s) - t0)) s)")
	say "${summary[-1]} (logs: $log-*)"
done

printf '%s\n' "${summary[@]}"
exit $status
