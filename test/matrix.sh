#!/usr/bin/env bash
# test/matrix.sh: "make test-matrix".  Builds idem and runs its whole test
# suite ("make test") against other PostgreSQL majors, each inside a Debian
# chroot that holds only Debian's own packages of that major:
#
#   major  Debian suite
#   15     bookworm
#   17     trixie
#   18     sid
#   19     sid, with the server from experimental (release candidate)
#
# (16 is in no Debian suite.)  Usage, as root:
#
#   make test-matrix PG_MAJORS="17 18 19"
#
# The chroots live under $IDEM_MATRIX_DIR (/var/tmp/idem-matrix) and are
# kept: the first run of a suite debootstraps it and installs the packages
# (about 1.5 minutes each here), later runs reuse it.  Each chroot takes
# about 2 GB.  Where Debian has no pgTAP package for a major (19), pgTAP's
# SQL files come from the previous major's package.  The tree is copied in as git sees it
# (tracked files and untracked ones that are not ignored), so uncommitted
# changes are tested.  It ends with one line per major:
#
#   pg17: build ok, 170 passed, 0 failed (212 s)
#
# and exits non-zero if a build or a test failed.  Logs stay in
# $IDEM_MATRIX_DIR/logs.  The suite selectors of test/run.sh
# (IDEM_TEST_SUITES, IDEM_TEST_REGRESS, IDEM_TEST_ISOLATION, IDEM_TEST_TAP)
# are passed in, to run a part of the suite on every major.
set -uo pipefail
cd "$(dirname "$0")/.."

MIRROR=${IDEM_MATRIX_MIRROR:-http://deb.debian.org/debian}
ROOT=${IDEM_MATRIX_DIR:-/var/tmp/idem-matrix}
MAJORS=${PG_MAJORS:-17 18 19}
CFLAGS=${IDEM_CFLAGS:--Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror}
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
	17) echo trixie ;;
	18 | 19) echo sid ;;
	*) return 1 ;;
	esac
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
	if [ ! -e "$dir/.idem-pg$major" ]; then
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
	pg_config=/usr/lib/postgresql/$major/bin/pg_config
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
	for v in IDEM_TEST_SUITES IDEM_TEST_REGRESS IDEM_TEST_ISOLATION IDEM_TEST_TAP; do
		[ -n "${!v:-}" ] && selectors+="$v='${!v}' "
	done
	if [ $build = ok ]; then
		port=$((port + 1))
		inside "$dir" sh -c "cd $work && make -s clean PG_CONFIG=$pg_config >/dev/null &&
			IDEM_TEST_PORT=$port $selectors make test PG_CONFIG=$pg_config IDEM_CFLAGS='$CFLAGS'" \
			>"$log-test.log" 2>&1
		rc=$?
		if line=$(grep -E '^idem: [0-9]+ passed, [0-9]+ failed$' "$log-test.log" | tail -n 1); then
			result=${line#idem: }
		fi
		if [ $rc != 0 ] || [[ $result != *" 0 failed" ]]; then
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
