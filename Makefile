# Makefile for idem, a PostgreSQL extension built with PGXS.
#
#   make            build
#   make install    install into the PostgreSQL that pg_config names
#   make run        build, install and start a private throwaway server
#   make test       every test suite, each against a temporary server
#   make test-matrix  make test against other majors, in Debian chroots
#                   (PG_MAJORS="17 18 19"; as root)
#   make memcheck   pg_regress under Valgrind, and a million calls' memory
#   make bench      idem against hand-written SQL and PL/pgSQL
#
# The version lives in idem.control only.

EXTENSION = idem
EXTVERSION := $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" idem.control)

MODULE_big = idem
OBJS = $(patsubst %.c,%.o,$(wildcard src/*.c))

DATA = $(wildcard idem--*.sql)

# The suites, as PGXS runs them: "make installcheck" runs pg_regress, the
# isolation specs and the TAP scripts against the installed server (which
# must have idem in shared_preload_libraries).  "make test" runs them too,
# each against a temporary server of its own, with pgTAP and the HTTP
# example besides.
REGRESS = $(sort $(patsubst sql/%.sql,%,$(wildcard sql/*.sql)))
REGRESS_OPTS = --temp-config=test/idem.conf
ISOLATION = $(sort $(patsubst test/isolation/specs/%.spec,%,\
	$(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --load-extension=idem \
	--temp-config=test/idem.conf
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

# The TAP scripts start servers of their own, which initdb refuses to do as
# root: "make installcheck" as root runs pg_regress and the isolation specs
# and says how to run the TAP scripts.
ifeq ($(filter installcheck,$(MAKECMDGOALS)),installcheck)
ifeq ($(shell id -u),0)
TAP_TESTS =
$(warning make installcheck as root skips the TAP scripts (initdb refuses root): run them as another user, e.g. "runuser -u postgres -- make installcheck")
endif
endif

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Only what the server looks up by name is exported (src/compat.h): PGXS
# hides the rest from PostgreSQL 16 on (CFLAGS_SL_MODULE), and so do we on 15
ifeq ($(CFLAGS_SL_MODULE),)
override CFLAGS += -fvisibility=hidden
endif

# A change to a header rebuilds every object: PGXS tracks headers only when
# PostgreSQL was configured with --enable-depend, which packages are not,
# and an object built against an older struct layout corrupts memory
ifneq ($(autodepend),yes)
$(OBJS): $(wildcard src/*.h)
endif

.PHONY: test test-matrix run stop memcheck bench sql-edition

test:
	@PG_CONFIG='$(PG_CONFIG)' IDEM_CFLAGS='$(IDEM_CFLAGS)' bash test/run.sh

test-matrix:
	@PG_MAJORS='$(PG_MAJORS)' bash test/matrix.sh

run:
	@PG_CONFIG='$(PG_CONFIG)' bash test/demo.sh start

stop:
	@PG_CONFIG='$(PG_CONFIG)' bash test/demo.sh stop

memcheck:
	@PG_CONFIG='$(PG_CONFIG)' bash test/memcheck.sh

bench:
	@PG_CONFIG='$(PG_CONFIG)' bash test/bench.sh

# The SQL edition for managed services (sql-edition/README.md):
# sql-edition/idem.sql and sql-edition/idem_tle.sql
sql-edition:
	@python3 sql-edition/generate.py

# Packaging (test/package.sh): the Debian packages postgresql-NN-idem in
# deb-build/, the PGXN archive idem-$(EXTVERSION).zip, and the test that
# installs both where idem was never built and runs installcheck.
.PHONY: deb dist test-package

deb:
	@bash test/package.sh deb

dist:
	@bash test/package.sh dist

test-package:
	@bash test/package.sh test
