#!/usr/bin/env python3
"""test/include_graph.py: fail on a circle in the #include graph of src/.

A room is a .c file together with the header of the same name that
declares functions it defines.  Any other header (shared types: idem.h,
compat.h; a room's private interface: record_way.h) belongs to no room and
passes its own #include lines on to whoever includes it.  An arrow runs
from a room to every room whose header one of its files reaches.  Data
flows one way (entry points, protocol, access, table: doc/hacking.md), so
the arrows must form no circle.  Prints each room's arrows and every
circle found; exits 1 if there is one.
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else 'src'
text = {}
for f in sorted(os.listdir(src)):
    if f.endswith(('.c', '.h')):
        with open(os.path.join(src, f), encoding='utf-8', errors='replace') as fh:
            text[f] = fh.read()


def includes(f):
    return [h for h in re.findall(r'^\s*#\s*include\s+"([^"/]+)"', text[f], re.M)
            if h in text]


def owner(h):
    """The room that header h belongs to, or None"""
    stem = h[:-2]
    c = stem + '.c'
    if c not in text:
        return None
    defined = set(re.findall(r'^([A-Za-z_]\w*)\(', text[c], re.M))
    declared = set(re.findall(r'\b([A-Za-z_]\w*)\s*\(', text[h]))
    return stem if defined & declared else None


def reached(f, seen):
    rooms = set()
    for h in includes(f):
        if h in seen:
            continue
        seen.add(h)
        room = owner(h)
        rooms |= {room} if room else reached(h, seen)
    return rooms


arrows = {}
for f in text:
    room = f[:-2] if f.endswith('.c') else owner(f)
    if room:
        arrows.setdefault(room, set()).update(reached(f, {f}) - {room})

circles = []
state = {}                      # 1 while on the path, 2 once left


def visit(room, path):
    state[room] = 1
    path.append(room)
    for to in sorted(arrows.get(room, ())):
        if state.get(to) == 1:
            circles.append(path[path.index(to):] + [to])
        elif to not in state:
            visit(to, path)
    path.pop()
    state[room] = 2


for room in sorted(arrows):
    if room not in state:
        visit(room, [])
for room in sorted(arrows):
    print('%s -> %s' % (room, ' '.join(sorted(arrows[room])) or '(nothing)'))
for c in circles:
    print('circle: ' + ' -> '.join(c))
sys.exit(1 if circles else 0)
