#!/usr/bin/env bash
# test/package.sh: idem as DBAs install it, from a package or a release
# archive rather than from this tree.
#
#   bash test/package.sh deb    (make deb) the Debian packages
#       postgresql-NN-idem, built by pg_buildext for each installed major
#       that debian/pgversions allows (PG_SUPPORTED_VERSIONS narrows them),
#       from a copy of the tree in deb-build/, where they are left
#   bash test/package.sh dist   (make dist) the PGXN archive
#       idem-VERSION.zip, a "git archive" of HEAD, refused when META.json
#       does not name the version of idem.control
#   bash test/package.sh test   (make test-package) builds the 15 package
#       and the archive, and for each: a private copy of the PostgreSQL 15
#       installation where idem was never built, idem put into it (the
#       package unpacked by dpkg -x; the archive unpacked elsewhere, built
#       and installed), a server started from it with idem preloaded,
#       CREATE EXTENSION idem, and "make installcheck" against that server
#       (of the TAP scripts, 061_upgrade and 062_rolling_upgrade, which
#       need every install and upgrade script installed; make test runs
#       them all against the same code).
#       IDEM_INSTALLCHECK_ARGS adds make arguments (e.g. "REGRESS=claim
#       ISOLATION= PROVE_TESTS=test/t/061_upgrade.pl" for a quick run);
#       IDEM_PACKAGE_PORT is the first of the two servers' ports.
#
# As root, missing Debian packages are installed first, and the servers run
# as the postgres user.
set -euo pipefail
cd "$(dirname "$0")/.."

. test/lib.sh

VERSION=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idem.control)

# Install the Debian packages named, when missing: as root with apt-get,
# otherwise say what to install.
ensure_debs() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' ||
			missing+=("$p")
	done
	apt_install "${missing[@]}"
}

# copy_tree DEST: the tree's own files (what git tracks, and new files it
# does not ignore), without build outputs
copy_tree() {
	local dest=$1
	mkdir -p "$dest"
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git ls-files -z -co --exclude-standard |
			while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
			tar --null -T - -cf - | tar -C "$dest" -xf -
	else
		tar --exclude=./deb-build --exclude=./tmp_check --exclude=./tmp_install \
			--exclude='*.o' --exclude='*.so' --exclude='*.bc' --exclude='./idem-*.zip' \
			-cf - . | tar -C "$dest" -xf -
	fi
}

build_deb() {
	ensure_debs dpkg-dev debhelper postgresql-server-dev-all
	local src=deb-build/idem-$VERSION
	rm -rf deb-build
	copy_tree "$src"
	# quilt format: the upstream tarball is the tree without debian/
	tar -C deb-build --exclude="idem-$VERSION/debian" \
		-czf "deb-build/idem_$VERSION.orig.tar.gz" "idem-$VERSION"
	# debian/control lists one package per major installed here
	(cd "$src" && pg_buildext updatecontrol >/dev/null &&
		dpkg-buildpackage -us -uc) >deb-build/build.log 2>&1 ||
		{ tail -50 deb-build/build.log; say "dpkg-buildpackage failed (deb-build/build.log)"; exit 1; }
	say "built $(cd deb-build && echo *.deb)"
}

build_dist() {
	local meta
	meta=$(perl -MJSON::PP -e '
		my $m = decode_json(do { local $/; <STDIN> });
		my $p = $m->{provides}{idem};
		print "$m->{version} $p->{version} $p->{file}";' <META.json)
	if [ "$meta" != "$VERSION $VERSION idem--$VERSION.sql" ]; then
		say "META.json says \"$meta\" (version, provided version, file), but idem.control says $VERSION"
		exit 1
	fi
	if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
		say "warning: uncommitted changes are not in the archive (it is made from HEAD)"
	fi
	git archive --format=zip --prefix="idem-$VERSION/" -o "idem-$VERSION.zip" HEAD
	say "built idem-$VERSION.zip (META.json and idem.control say $VERSION)"
}

# pg_copy DEST: a private copy of the PostgreSQL 15 installation, without
# any idem file, as core's "make check" builds one (the server finds its
# share and lib directories relative to its own binary)
pg_copy() {
	local dest=$1 d
	for d in "$PG_BINDIR" "$PG_PKGLIBDIR" "$PG_SHAREDIR"; do
		mkdir -p "$dest$d"
		cp -a "$d/." "$dest$d/"
	done
	find "$dest$PG_PKGLIBDIR" "$dest$PG_SHAREDIR/extension" -name 'idem*' -prune \
		-exec rm -rf {} +
}

# installcheck NAME PGROOT SRC PORT: start a server from the installation
# copied to PGROOT with idem preloaded, create the extension, and run make
# installcheck in the source tree SRC against it (as the current user)
installcheck() {
	local name=$1 pgroot=$2 src=$3 port=$4 rc=0 args
	local bin=$pgroot$PG_BINDIR data=$W/$name-data sock=$W/$name-sock
	# make's arguments, split at blanks and never globbed here
	read -r -a args <<<"${IDEM_INSTALLCHECK_ARGS:-}"
	mkdir -p "$sock"
	"$bin/initdb" -D "$data" -A trust --no-sync >"$W/$name-initdb.log" 2>&1
	cat "$src/test/idem.conf" >>"$data/postgresql.conf"
	"$bin/pg_ctl" -D "$data" -l "$W/$name-server.log" -w \
		-o "-k $sock -c listen_addresses= -p $port" start >/dev/null ||
		{ cat "$W/$name-server.log"; return 1; }
	say "$name: server from $pgroot on port $port"
	if "$bin/psql" -X -q -h "$sock" -p "$port" -d postgres -v ON_ERROR_STOP=1 -At \
		-c 'CREATE DATABASE idem_package' &&
		[ "$("$bin/psql" -X -q -h "$sock" -p "$port" -d idem_package -v ON_ERROR_STOP=1 -At \
			-c 'CREATE EXTENSION idem' \
			-c "SELECT extversion FROM pg_extension WHERE extname = 'idem'")" = "$VERSION" ]; then
		say "$name: CREATE EXTENSION idem installed $VERSION"
	else
		say "$name: CREATE EXTENSION idem did not install $VERSION"
		rc=1
	fi
	if [ $rc -eq 0 ]; then
		PGHOST=$sock PGPORT=$port PGUSER=$(id -un) \
			make -C "$src" installcheck PG_CONFIG="$bin/pg_config" \
			"${args[@]}" 2>&1 | tee "$W/$name-installcheck.log" || rc=1
	fi
	"$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null || rc=1
	if [ $rc -eq 0 ]; then
		say "$name: make installcheck passed"
	else
		cat "$src/regression.diffs" "$src/output_iso/regression.diffs" 2>/dev/null || true
		say "$name: make installcheck FAILED (logs in $W)"
	fi
	return $rc
}

# The part of "test" that runs as an ordinary user: build the archive
# elsewhere and install it, then both installchecks.
test_as_user() {
	W=$1
	PG_BINDIR=$(/usr/lib/postgresql/15/bin/pg_config --bindir)
	PG_PKGLIBDIR=$(/usr/lib/postgresql/15/bin/pg_config --pkglibdir)
	PG_SHAREDIR=$(/usr/lib/postgresql/15/bin/pg_config --sharedir)
	local port=${IDEM_PACKAGE_PORT:-54339} failed=0 dist=$W/dist/idem-$VERSION
	# of the TAP scripts, the upgrades, which need every install and upgrade
	# script installed (make test runs them all against this code); a
	# PROVE_TESTS of IDEM_INSTALLCHECK_ARGS, later on make's command line,
	# wins.  The glob is make's recipe's to expand, in the source tree.
	local TAP="PROVE_TESTS=test/t/06[12]_*.pl"

	say "dist: building the unpacked archive in $dist"
	if make -C "$dist" -s PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config >"$W/dist-build.log" 2>&1 &&
		make -C "$dist" -s install DESTDIR="$W/distpg" \
			PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config >>"$W/dist-build.log" 2>&1; then
		IDEM_INSTALLCHECK_ARGS="$TAP ${IDEM_INSTALLCHECK_ARGS:-}" \
			installcheck dist "$W/distpg" "$dist" $((port + 1)) || failed=$((failed + 1))
	else
		cat "$W/dist-build.log"
		say "dist: the unpacked archive does not build"
		failed=$((failed + 1))
	fi
	IDEM_INSTALLCHECK_ARGS="$TAP ${IDEM_INSTALLCHECK_ARGS:-}" \
		installcheck package "$W/pkg" "$W/src" "$port" || failed=$((failed + 1))
	[ $failed -eq 0 ]
}

test_package() {
	ensure_debs make gcc unzip postgresql-15 postgresql-server-dev-15 \
		libipc-run-perl dpkg-dev debhelper postgresql-server-dev-all
	PG_SUPPORTED_VERSIONS=15 build_deb
	build_dist

	PG_BINDIR=$(/usr/lib/postgresql/15/bin/pg_config --bindir)
	PG_PKGLIBDIR=$(/usr/lib/postgresql/15/bin/pg_config --pkglibdir)
	PG_SHAREDIR=$(/usr/lib/postgresql/15/bin/pg_config --sharedir)
	W=$(mktemp -d /tmp/idem-package.XXXXXX)
	chmod 755 "$W"

	# the package, unpacked into a PostgreSQL where idem was never built
	local deb
	deb=$(echo deb-build/postgresql-15-idem_"$VERSION"-*_*.deb)
	[ -f "$deb" ] || { say "no postgresql-15-idem package in deb-build/"; exit 1; }
	pg_copy "$W/pkg"
	dpkg -x "$deb" "$W/pkg"
	say "package: $deb unpacked into $W/pkg:"
	dpkg -c "$deb" | awk '{print "    " $6}' | grep -E '\.(so|control|sql)$'
	# the tests to run against it, from this tree: nothing built there
	copy_tree "$W/src"

	# the archive, unpacked elsewhere; built and installed as its user would
	mkdir -p "$W/dist"
	unzip -q "idem-$VERSION.zip" -d "$W/dist"
	pg_copy "$W/distpg"

	local rc=0
	if is_root; then
		chown -R postgres: "$W"
		runuser -u postgres -- env PATH="$PATH" \
			IDEM_INSTALLCHECK_ARGS="${IDEM_INSTALLCHECK_ARGS:-}" \
			IDEM_PACKAGE_PORT="${IDEM_PACKAGE_PORT:-}" \
			bash "$W/src/test/package.sh" test-as-user "$W" || rc=$?
	else
		(cd "$W/src" && bash test/package.sh test-as-user "$W") || rc=$?
	fi
	if [ $rc -eq 0 ]; then
		rm -rf "$W"
		say "package test: the 15 package and the dist archive pass make installcheck"
	else
		say "package test FAILED; kept $W for inspection"
	fi
	return $rc
}

case "${1:-}" in
	deb) build_deb ;;
	dist) build_dist ;;
	test) test_package ;;
	test-as-user) test_as_user "$2" ;;
	*) echo "usage: $0 deb|dist|test" >&2; exit 2 ;;
esac
