#!/usr/bin/env python3
"""Write the SQL edition of idem from the C edition's install script.

What both editions share -- tables, indexes, views, policies, grants,
comments and the functions' signatures -- is written once, in
idem--<version>.sql (the version is idem.control's default_version).  What
differs is in sql-edition/edition.sql, beside nothing else:

    --@ omit <regex>            leave out every statement of the C script
                                that the regex finds (objects only a
                                library can have, such as a base type)
    --@ before <regex>          the SQL up to "--@ end" goes before the
                                first statement the regex finds
    --@ body <name>(<types>) [| <name>(<types>) ...] <attributes>
                                the body, up to "--@ end", of the C
                                functions of those names and argument
                                types (overloads that share their text);
                                <attributes> replace "LANGUAGE C" and keep
                                the C declaration's volatility and the rest

Every C function needs its body there (or an omit), and every directive
must find what it names: the generator refuses to write otherwise, and
refuses a file in which "MODULE_PATHNAME", "$libdir" or "LANGUAGE C" is
left, comments included.

Writes sql-edition/idem.sql (a plain script for psql) and
sql-edition/idem_tle.sql (registers extension idem with pg_tle).  Each also
updates what an earlier release's file installed (from FIRST on): the C
upgrade scripts from that release to this one, with edition.sql applied,
then every function of this version again, since a body that lives in
edition.sql changes with no upgrade script naming it, then a drop of the
helpers (idem_sql_*) this version no longer defines.  Not carried, so the
release that makes one must add its step here: a helper whose result type
or argument names change, and a change to a table, view or trigger of a
"before" block (sql-edition/README.md, "Updating").
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
QUOTE = "$_idem_tle_$"
# the first release with an SQL edition: its updates start there
FIRST = "0.4.0"


def control_version():
    with open(os.path.join(TOP, "idem.control")) as f:
        for line in f:
            m = re.match(r"\s*default_version\s*=\s*'([^']+)'", line)
            if m:
                return m.group(1)
    sys.exit("generate.py: no default_version in idem.control")


def control_comment():
    with open(os.path.join(TOP, "idem.control")) as f:
        for line in f:
            m = re.match(r"\s*comment\s*=\s*'((?:[^']|'')*)'", line)
            if m:
                return m.group(1).replace("''", "'")
    return "idem"


def after_comment(sql, i):
    """Where the comment that starts at i ends: a line comment with its
    newline, a block comment with the blocks nested in it"""
    n = len(sql)
    if sql.startswith("--", i):
        j = sql.find("\n", i)
        return n if j < 0 else j + 1
    depth = 0
    while i < n:
        if sql.startswith("/*", i):
            depth += 1
            i += 2
        elif sql.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                break
        else:
            i += 1
    return i


def statements(sql):
    """Split a script into its statements, each with the comments before it.

    Knows what a PostgreSQL script may hold around a semicolon: quoted
    literals and identifiers, dollar quotes, line and block comments.
    """
    out = []
    start = 0
    i = 0
    n = len(sql)
    while i < n:
        c = sql[i]
        if sql.startswith("--", i) or sql.startswith("/*", i):
            i = after_comment(sql, i)
        elif c in ("'", '"'):
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
        elif c == "$":
            m = re.match(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$", sql[i:])
            if m:
                tag = m.group(0)
                j = sql.find(tag, i + len(tag))
                if j < 0:
                    sys.exit("generate.py: unterminated dollar quote " + tag)
                i = j + len(tag)
            else:
                i += 1
        elif c == ";":
            out.append(sql[start:i + 1])
            start = i + 1
            i += 1
        else:
            i += 1
    rest = sql[start:]
    if rest.strip():
        out.append(rest)
    return out


def code_of(stmt):
    """A statement without its comments, for matching"""
    s = re.sub(r"/\*.*?\*/", " ", stmt, flags=re.S)
    s = re.sub(r"--[^\n]*", " ", s)
    return s.strip()


def split_top(text):
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def signature(code):
    """name(type, ...) of a CREATE FUNCTION, IN arguments only"""
    m = re.match(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)\s*\(",
                 code, re.I)
    if not m:
        return None
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
    types = []
    for arg in split_top(code[m.end():i - 1]):
        arg = re.split(r"\s+DEFAULT\s+|\s*=\s*", arg.strip(), flags=re.I)[0]
        words = arg.split()
        if words and words[0].upper() == "OUT":
            continue
        if words and words[0].upper() in ("IN", "INOUT", "VARIADIC"):
            words = words[1:]
        # a lone word is a type; otherwise the first word is the name
        types.append(" ".join(words if len(words) == 1 else words[1:]).lower())
    return "%s(%s)" % (m.group(1), ", ".join(types))


def read_edition():
    with open(os.path.join(HERE, "edition.sql")) as f:
        lines = f.read().split("\n")
    omit, before, bodies = [], [], {}
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"--@ (omit|before|body) (.*)$", line)
        i += 1
        if not m:
            continue
        kind, arg = m.group(1), m.group(2).strip()
        if kind == "omit":
            omit.append(re.compile(arg, re.S))
            continue
        block = []
        while i < len(lines) and lines[i] != "--@ end":
            block.append(lines[i])
            i += 1
        if i == len(lines):
            sys.exit("generate.py: --@ %s %s has no --@ end" % (kind, arg))
        i += 1
        text = "\n".join(block).strip("\n")
        if kind == "before":
            before.append([re.compile(arg, re.S), text, False])
        else:
            m = re.match(r"((?:\S+\(.*?\)\s*\|\s*)*\S+\(.*?\))\s*(.*)$", arg)
            if not m:
                sys.exit("generate.py: --@ body needs name(types): " + arg)
            for sig in m.group(1).split("|"):
                key = re.sub(r"\s*,\s*", ", ", sig.strip().lower())
                if key in bodies:
                    sys.exit("generate.py: two bodies for " + key)
                bodies[key] = [m.group(2), text, False]
    return omit, before, bodies


def c_script(name):
    with open(os.path.join(TOP, name)) as f:
        # psql's meta-commands (the guard against running the script by hand)
        return re.sub(r"^\\[^\n]*\n", "", f.read(), flags=re.M)


def convert(source, edition, whole):
    """The C script source with edition.sql applied.

    whole: source is a version's install script, so every "before" must
    find its statement and every body its function; in an upgrade step the
    "before" blocks are not placed (what they create comes with the
    step's replay, below) and a body may go unused.
    """
    omit, before, bodies = edition
    out = []
    for stmt in statements(source):
        code = code_of(stmt)
        if not code:
            out.append(stmt)
            continue
        if whole:
            for b in before:
                if not b[2] and b[0].search(code):
                    out.append("\n\n" + b[1] + "\n")
                    b[2] = True
        if any(r.search(code) for r in omit):
            continue
        if "MODULE_PATHNAME" not in code:
            out.append(stmt)
            continue
        sig = signature(code)
        m = re.search(r"AS\s+'MODULE_PATHNAME'\s*,\s*'\w+'\s*LANGUAGE\s+C\b",
                      stmt, re.I)
        if sig is None or m is None:
            sys.exit("generate.py: cannot read the C function in:\n" + stmt)
        body = bodies.get(sig)
        if body is None and not whole:
            # a function of an upgrade step that a later step drops
            body = ["LANGUAGE plpgsql", "BEGIN\n\tRAISE EXCEPTION 'dropped "
                    "by a later update';\nEND", False]
        if body is None:
            sys.exit("generate.py: edition.sql has no body for " + sig)
        attributes, text = body[0], body[1]
        body[2] = True
        out.append(stmt[:m.start()] + "AS $idem$\n" + text + "\n$idem$\n"
                   + attributes + stmt[m.end():])
    if whole:
        unused = [k for k, b in bodies.items() if not b[2]]
        unused += [b[0].pattern for b in before if not b[2]]
        if unused:
            sys.exit("generate.py: edition.sql names what the C script lacks: "
                     + "; ".join(unused))
    script = "".join(out)
    for word in ("MODULE_PATHNAME", "$libdir", "LANGUAGE C ", "LANGUAGE C\n",
                 "LANGUAGE C;"):
        if word in script:
            sys.exit("generate.py: the SQL edition still holds " + word)
    return script


def edition_script(version):
    return convert(c_script("idem--%s.sql" % version), read_edition(), True)


def vkey(version):
    """A release's version (numbers and dots only) for comparing"""
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        sys.exit("generate.py: a version of numbers and dots, not " + version)
    return tuple(int(x) for x in version.split("."))


def upgrades(version):
    """{from: steps}: for each earlier release that had an SQL edition (each
    version from FIRST on that an upgrade script leads from), the C upgrade
    scripts that lead from it to version, shortest chain first"""
    edges = {}
    for n in os.listdir(TOP):
        m = re.match(r"idem--([^-]+)--([^-]+)\.sql$", n)
        if m:
            edges.setdefault(m.group(1), []).append(m.group(2))
    paths = {}
    for start in edges:
        if start == version or vkey(start) < vkey(FIRST):
            continue
        queue, seen = [[start]], {start}
        while queue:
            chain = queue.pop(0)
            if chain[-1] == version:
                paths[start] = ["idem--%s--%s.sql" % (a, b)
                                for a, b in zip(chain, chain[1:])]
                break
            for nxt in sorted(edges.get(chain[-1], [])):
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(chain + [nxt])
        if start not in paths and vkey(start) < vkey(version):
            sys.exit("generate.py: no upgrade scripts lead from %s to %s"
                     % (start, version))
    return paths


def lead(stmt):
    """The statement without the comments and blank space before it"""
    i, n = 0, len(stmt)
    while i < n:
        if stmt[i].isspace():
            i += 1
        elif stmt.startswith("--", i) or stmt.startswith("/*", i):
            i = after_comment(stmt, i)
        else:
            break
    return stmt[i:]


def upgrade_script(steps, script):
    """An update of the SQL edition: the C upgrade steps, each with
    edition.sql applied, then every function of the new version's script
    again (CREATE OR REPLACE) with its grants and comment, since a body
    that lives in edition.sql changes with no C upgrade step naming it;
    then the edition's own helpers (idem_sql_*) that the new version no
    longer defines are dropped, so that no old worker stays callable"""
    edition = read_edition()
    # the steps may create functions that a later step drops, whose bodies
    # edition.sql no longer has: pg_tle and psql need no body of those
    out = ["SET LOCAL check_function_bodies = off;\n"]
    for step in steps:
        out.append("\n-- %s\n" % step)
        out.append(convert(c_script(step), edition, False))
    out.append("\n-- every function of the new version, again\n"
               "SET LOCAL check_function_bodies = on;\n")
    created = replayed = 0
    for stmt in statements(script):
        text = lead(stmt)
        if re.match(r"CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE)\b",
                    code_of(stmt), re.I):
            created += 1
        m = re.match(r"CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE)\b",
                     text, re.I)
        if m:
            replayed += 1
            out.append("\nCREATE OR REPLACE %s%s\n" % (m.group(1), text[m.end():]))
        elif re.match(r"(GRANT|REVOKE)\b[^;]*?\bON\s+(FUNCTION|PROCEDURE|ROUTINE)\b"
                      r"|COMMENT\s+ON\s+(FUNCTION|PROCEDURE|ROUTINE)\b", text, re.I):
            out.append("\n" + text + "\n")
        elif re.match(r"ALTER\s+(FUNCTION|PROCEDURE|ROUTINE)\b", text, re.I):
            sys.exit("generate.py: an update cannot replay " + text.split("\n")[0])
    if created != replayed:
        sys.exit("generate.py: %d functions created, %d replayed" % (created, replayed))
    # what this transaction did not write, it did not define (the schema
    # is the first of the search_path: psql's for the plain script, and
    # the extension's during ALTER EXTENSION)
    out.append("""
DO $_idem_drop_$
DECLARE
	f			regprocedure;
BEGIN
	FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p
			  WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace
				AND p.proname LIKE 'idem\\_sql\\_%%'
				AND p.xmin::text::bigint <> pg_catalog.pg_current_xact_id()::text::bigint %% 4294967296
	LOOP
		EXECUTE pg_catalog.format('DROP FUNCTION %%s', f);
	END LOOP;
END
$_idem_drop_$;
""" % ())
    return "".join(out)


def plain_text(text):
    """A part of the plain script: no extension, the schema psql found"""
    text = re.sub(r"^SELECT pg_catalog\.pg_extension_config_dump\(.*?\);\n",
                  "", text, flags=re.M | re.S)
    return text.replace("@extschema@", ':"idem_schema"')


def plain(script, version, ups):
    """The script for psql, in the schema first in the search_path"""
    where = ("coalesce(pg_catalog.obj_description(pg_catalog.to_regprocedure("
             "pg_catalog.quote_ident(:'idem_schema') || '.idem_edition()'), 'pg_proc'), '')")
    tag = """
COMMENT ON FUNCTION idem_edition() IS
	'which edition of idem this is: sql (this one) or c [idem %s]';
COMMIT;
""" % version
    head = """\
-- idem %(v)s, the SQL edition, as a plain script (generated by
-- sql-edition/generate.py from idem--%(v)s.sql and sql-edition/edition.sql).
-- Run it with psql as the database's owner:
--     psql -v ON_ERROR_STOP=1 -f idem.sql
-- It creates idem's objects in the first schema of the search_path, in one
-- transaction; run again at the same version, it changes nothing; run where
-- an earlier release's file installed idem, it updates that in place,
-- keeping the records.
\\set ON_ERROR_STOP 1
SELECT pg_catalog.current_schema() AS idem_schema \\gset
SELECT pg_catalog.to_regprocedure(pg_catalog.quote_ident(:'idem_schema') || '.idem_edition()') IS NOT NULL AS idem_present \\gset
\\if :idem_present
SELECT %(w)s LIKE '%%[idem %(v)s]' AS idem_same \\gset
\\if :idem_same
\\echo idem %(v)s is already installed in schema :idem_schema
\\quit
\\endif
""" % {"v": version, "w": where}
    for old in sorted(ups, key=vkey):
        head += """\
SELECT %(w)s LIKE '%%[idem %(a)s]' AS idem_update \\gset
\\if :idem_update
\\echo updating idem in schema :idem_schema from %(a)s to %(v)s
BEGIN;
%(u)s%(t)s\\quit
\\endif
""" % {"w": where, "a": old, "v": version, "u": plain_text(ups[old]), "t": tag}
    head += """\
\\echo another version of idem is installed in schema :idem_schema
DO $$ BEGIN RAISE EXCEPTION 'another version of idem is installed in this schema'; END $$;
\\endif
BEGIN;
"""
    return head + plain_text(script) + tag


def tle(script, version, ups):
    """The file that registers this version with pg_tle: the extension
    where idem is not registered yet; where an earlier release is, this
    version beside it, with an update path from each earlier release that
    had an SQL edition, as the new default (ALTER EXTENSION idem UPDATE)"""
    for text in [script] + list(ups.values()):
        if QUOTE in text or "$_pgtle_" in text or "$_idem_do_$" in text:
            sys.exit("generate.py: the script holds a pg_tle quote")
    paths = "".join("""
		IF NOT EXISTS (SELECT FROM pgtle.extension_update_paths('idem')
					   WHERE source = '%(a)s' AND target = '%(v)s'
						 AND path = '%(a)s--%(v)s') THEN
			PERFORM pgtle.install_update_path('idem', '%(a)s', '%(v)s', %(q)s
%(u)s
%(q)s);
		END IF;""" % {"a": old, "v": version, "q": QUOTE, "u": ups[old]}
                    for old in sorted(ups, key=vkey))
    return """\
-- idem %(v)s, the SQL edition, for pg_tle (generated by
-- sql-edition/generate.py from idem--%(v)s.sql and sql-edition/edition.sql).
-- A member of pgtle_admin runs it once per database:
--     psql -v ON_ERROR_STOP=1 -f idem_tle.sql
-- and then CREATE EXTENSION idem, or, where an earlier release's file
-- registered idem, ALTER EXTENSION idem UPDATE.  Run again, it changes
-- nothing.
DO $_idem_do_$
DECLARE
	script text := %(q)s
%(s)s
%(q)s;
BEGIN
	IF NOT EXISTS (SELECT FROM pgtle.available_extensions() WHERE name = 'idem') THEN
		PERFORM pgtle.install_extension('idem', '%(v)s', %(c)s, script);
	ELSE
		IF NOT EXISTS (SELECT FROM pgtle.available_extension_versions()
					   WHERE name = 'idem' AND version = '%(v)s') THEN
			PERFORM pgtle.install_extension_version_sql('idem', '%(v)s', script);
		END IF;%(p)s
		/* never back to an older version: its file run after this one's */
		IF EXISTS (SELECT FROM pgtle.available_extensions()
					WHERE name = 'idem'
					  AND string_to_array(default_version, '.')::int[]
						  < string_to_array('%(v)s', '.')::int[]) THEN
			PERFORM pgtle.set_default_version('idem', '%(v)s');
		END IF;
	END IF;
END
$_idem_do_$;
""" % {"v": version, "c": "'" + control_comment().replace("'", "''") + "'",
       "q": QUOTE, "s": script, "p": paths}


def main():
    version = control_version()
    script = edition_script(version)
    ups = {old: upgrade_script(steps, script)
           for old, steps in upgrades(version).items()}
    for name, text in (("idem.sql", plain(script, version, ups)),
                       ("idem_tle.sql", tle(script, version, ups))):
        with open(os.path.join(HERE, name), "w") as f:
            f.write(text)
        print("wrote sql-edition/" + name)


if __name__ == "__main__":
    main()
