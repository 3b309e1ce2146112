# test/lib.sh: shell helpers shared by test/run.sh (make test),
# test/demo.sh (make run) and test/package.sh.  Sourced, never run.

# The major to build and test for: the one PG_CONFIG names, else Debian
# bookworm's 15 (what ensure_packages installs on a fresh machine).
if [ -z "${PG_MAJOR:-}" ]; then
	PG_MAJOR=$(${PG_CONFIG:-pg_config} --version 2>/dev/null |
		sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p') || true
	PG_MAJOR=${PG_MAJOR:-15}
fi
# The server and its headers come from Debian's packages, unless PG_CONFIG
# names a PostgreSQL built from source (test/matrix.sh builds 16 so, since
# no Debian suite ships it): then only the test tools are Debian's.
pg_from_source() {
	local bin
	bin=$(${PG_CONFIG:-pg_config} --bindir 2>/dev/null) || return 1
	! dpkg-query -S "$bin/postgres" >/dev/null 2>&1
}
PACKAGES="make gcc libtap-parser-sourcehandler-pgtap-perl libipc-run-perl pgbouncer"
# the Python client package's build and tests (clients/python), with
# Debian's python3
PACKAGES="$PACKAGES python3-psycopg python3-starlette python3-httpx python3-django
python3-pytest python3-build python3-setuptools python3-wheel python3-venv python3-uvicorn"
pg_from_source || PACKAGES="$PACKAGES postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR
postgresql-$PG_MAJOR-pgtap"

say() { printf 'idem: %s\n' "$*"; }

is_root() { [ "$(id -u)" = 0 ]; }

# Install the Debian packages the build and the suites need.  As root,
# apt-get installs what is missing; otherwise we say what to install.
ensure_packages() {
	local missing=() p
	for p in $PACKAGES; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' &&
			continue
		# pgTAP installed some other way (test/matrix.sh, for 19) serves too
		[ "$p" = "postgresql-$PG_MAJOR-pgtap" ] &&
			[ -f "$(${PG_CONFIG:-pg_config} --sharedir 2>/dev/null)/extension/pgtap.control" ] &&
			continue
		missing+=("$p")
	done
	# the HTTP example needs Node.js and npm, from Debian unless already here
	command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
	apt_install "${missing[@]}"
}

# apt_install PACKAGE...: as root, install the Debian packages named;
# otherwise say how to install them, and stop.
apt_install() {
	[ $# -eq 0 ] && return 0
	if is_root; then
		say "installing $*"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends "$@" >/dev/null
	else
		say "missing Debian packages: $*"
		say "install them with: sudo apt-get install $*"
		exit 1
	fi
}

# Where this PostgreSQL keeps things.
pg_dirs() {
	PG_CONFIG=${PG_CONFIG:-pg_config}
	PG_BINDIR=$($PG_CONFIG --bindir)
	PG_PKGLIBDIR=$($PG_CONFIG --pkglibdir)
	PG_SHAREDIR=$($PG_CONFIG --sharedir)
	PG_PGXSDIR=$(dirname "$($PG_CONFIG --pgxs)")/../..
}

# A private copy of the PostgreSQL installation under $1 with idem
# installed into it, as core's "make check" does: the server finds its
# share and lib directories relative to its own binary, so a normal user
# can test without writing to the system's directories.  Prints the bin
# directory to use.
private_install() {
	local dest=$1
	rm -rf "$dest"
	mkdir -p "$dest$PG_BINDIR" "$dest$PG_PKGLIBDIR" "$dest$PG_SHAREDIR"
	cp -a "$PG_BINDIR/." "$dest$PG_BINDIR/"
	cp -a "$PG_PKGLIBDIR/." "$dest$PG_PKGLIBDIR/"
	cp -a "$PG_SHAREDIR/." "$dest$PG_SHAREDIR/"
	make -s install DESTDIR="$dest" PG_CONFIG="$PG_CONFIG" >/dev/null
}

# Run a copy of this tree's command as the unprivileged postgres user:
# PostgreSQL refuses to run as root.  The tree is copied to a fresh
# directory that user owns, since the caller's checkout may sit where it
# cannot read or write.  The copy is removed if the command succeeds;
# IDEM_COPY_BACK names a directory of results to copy back first.
run_as_postgres() {
	local script=$1
	shift
	local stage
	stage=$(mktemp -d "${TMPDIR:-/tmp}/idem-stage.XXXXXX")
	tar -C "$PWD" --exclude=.git --exclude=tmp_check --exclude=tmp_install \
		--exclude='*.o' --exclude='*.so' --exclude=node_modules -cf - . | tar -C "$stage" -xf -
	chown -R postgres: "$stage"
	chmod 755 "$stage"
	say "running as user postgres in $stage"
	local rc=0 pass=() v
	for v in $(compgen -e); do
		case $v in IDEM_BENCH_* | IDEM_MEMCHECK_* | IDEM_FUZZ_* | IDEM_TEST_*)
			pass+=("$v=${!v}") ;;
		esac
	done
	runuser -u postgres -- env PG_CONFIG="${PG_CONFIG:-pg_config}" \
		IDEM_CFLAGS="${IDEM_CFLAGS:-}" PATH="$PATH" "${pass[@]}" \
		bash "$stage/$script" "$@" || rc=$?
	if [ -n "${IDEM_COPY_BACK:-}" ] && [ -d "$stage/$IDEM_COPY_BACK" ]; then
		mkdir -p "$PWD/$IDEM_COPY_BACK"
		cp -a "$stage/$IDEM_COPY_BACK/." "$PWD/$IDEM_COPY_BACK/"
	fi
	if [ $rc -eq 0 ]; then
		rm -rf "$stage"
	else
		say "kept $stage for inspection (tmp_check/ holds the logs)"
	fi
	return $rc
}

# Citus, for the citus suite (test/citus/): where its source tarballs and
# the cache of its build are (test/citus/build.sh builds it).
CITUS_CACHE=${IDEM_TEST_CITUS_CACHE:-/var/tmp/idem-citus/$PG_MAJOR}
CITUS_TARBALL_GLOB=${IDEM_TEST_CITUS_TARBALL:-$PWD/../shared/vendor/citus-*.tar.gz}
# what a Citus build needs beside the server's headers: the libraries it
# links with (lz4, zstd, OpenSSL; libcurl where the server's headers say
# HAVE_LIBCURL, as Debian's 18 does, see test/citus/build.sh) and the
# headers that the server's headers include (ICU from 17 on, Kerberos)
CITUS_PACKAGES="liblz4-dev libzstd-dev libssl-dev libkrb5-dev libicu-dev
libcurl4-openssl-dev libxslt1-dev libpam0g-dev libreadline-dev"

# pg_tle, the stand-in for a managed service (test/tle/build.sh): its
# source, where its build is kept, and what building it needs
TLE_CACHE=${IDEM_TEST_TLE_CACHE:-/var/tmp/idem-pgtle/$PG_MAJOR}
TLE_TARBALL_GLOB=${IDEM_TEST_TLE_TARBALL:-$PWD/../shared/vendor/pg_tle-*.tar.gz}
TLE_PACKAGES="flex bison libkrb5-dev"

# tle_locate: set TLE_TARBALL to the newest pg_tle source, or return 1
tle_locate() {
	TLE_TARBALL=$(ls $TLE_TARBALL_GLOB 2>/dev/null | sort -V -r | head -n 1)
	[ -n "$TLE_TARBALL" ] && [ -f "$TLE_TARBALL" ]
}

# citus_majors TARBALL: the PostgreSQL majors that a Citus source supports,
# as its own configure script lists them
citus_majors() {
	tar -xzOf "$1" --wildcards '*/configure' 2>/dev/null |
		sed -n "s/^elif test \"\$version_num\" != .*; then$/&/p" |
		grep -oE "'[0-9]+'" | tr -d "'" | tr '\n' ' ' | sed 's/ $//'
}

# citus_locate: set CITUS_TARBALL to the newest tarball that supports
# PG_MAJOR; else return 1 with CITUS_SKIP saying why (no tarball, or none
# for this major)
citus_locate() {
	local t found=
	CITUS_TARBALL=
	for t in $(ls $CITUS_TARBALL_GLOB 2>/dev/null | sort -V -r); do
		[ -f "$t" ] || continue
		found=1
		if [[ " $(citus_majors "$t") " == *" $PG_MAJOR "* ]]; then
			CITUS_TARBALL=$t
			return 0
		fi
	done
	if [ -n "$found" ]; then
		CITUS_SKIP="no Citus release here supports PostgreSQL $PG_MAJOR"
	else
		CITUS_SKIP="no Citus source"
	fi
	return 1
}
