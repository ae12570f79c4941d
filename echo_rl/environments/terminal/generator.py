"""Procedurally generated terminal tasks: 12 templates over 3 levels, with verifiers and oracles.

Level 1 needs one command, level 2 a look then an act (2-3 commands: the agent
must read something from the file system first), level 3 multi-step file work
that the verifier checks file by file. Each template draws its instance from a
``random.Random`` seeded by ``"<template>:<index>"``, so a task is the same on
every machine. Each instance is a :class:`TerminalTask` whose setup, verifier
(``tests/test.sh`` plus the expected files, which the agent never sees) and
oracle (``solution.sh``) are generated together, so the oracle's score is
checkable (it is 1.0 on every instance: ``benchmarks/terminal_bench.py --oracle``,
and a sample of each template in the tests).

Splits: ``test`` holds the templates in :data:`HELD_OUT_TEMPLATES` entirely,
plus 20% of the instances of every other template (chosen by a hash of the
task name); ``train`` holds the rest (1,600 instances at the default 200 per
template).
"""

from __future__ import annotations

import hashlib
import random
import shlex
from typing import Callable

from echo_rl.environments.terminal.task import TerminalTask

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "ocean", "piano", "lemon", "honey", "eagle", "frost",
         "grape", "ivory", "jelly", "koala", "lunar", "mango", "noble", "olive", "pearl", "quiet", "robin", "solar",
         "tulip", "umber", "vivid", "whale", "xenon", "yacht", "zebra", "amber", "blaze", "cedar", "delta", "ember")
NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace")
EXTS = ("txt", "log", "csv", "md", "dat", "tmp", "bak")
TEST_PERCENT = 20
HELD_OUT_TEMPLATES = ("largest_file", "archive_project")
MAX_TURNS = {1: 6, 2: 8, 3: 12}
TEST_HEADER = "#!/bin/bash\nfail() { echo \"FAIL: $*\"; exit 1; }\n"


def _write(path: str, content: str) -> str:
    """A setup line writing ``content`` (exactly) to ``path``, creating its folder."""
    folder = path.rsplit("/", 1)[0] if "/" in path else ""
    mk = f"mkdir -p {shlex.quote(folder)} && " if folder else ""
    return f"{mk}printf '%s' {shlex.quote(content)} > {shlex.quote(path)}"


def _lines(rng: random.Random, n: int, width: int = 4) -> str:
    return "".join(" ".join(rng.choice(WORDS) for _ in range(width)) + "\n" for _ in range(n))


def _same(path: str, expected: str) -> str:
    """A test line: the file at ``path`` equals tests/``expected``."""
    return f"cmp -s {shlex.quote(path)} /tests/{shlex.quote(expected)} || fail '{path} is not as expected'\n"


# Each template: rng -> (instruction, setup lines, test script, {tests file: content}, solution commands)
Spec = tuple[str, list[str], str, dict[str, str], list[str]]


def make_dir(rng: random.Random) -> Spec:
    d = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
    return (f"Create a directory named {d} in the current directory.", [_write("README", "notes\n")],
            f"[ -d {d} ] || fail 'no directory {d}'\n", {}, [f"mkdir {d}"])


def write_line(rng: random.Random) -> Spec:
    name, line = f"{rng.choice(WORDS)}.txt", " ".join(rng.choice(WORDS) for _ in range(3))
    return (f"Create a file named {name} whose only content is this line: {line}", [],
            _same(name, "expected"), {"expected": line + "\n"}, [f"echo '{line}' > {name}"])


def copy_file(rng: random.Random) -> Spec:
    src, dst = f"{rng.choice(WORDS)}.txt", f"{rng.choice(WORDS)}_copy.txt"
    content = _lines(rng, rng.randint(2, 6))
    return (f"Copy the file data/{src} to {dst} in the current directory.", [_write(f"data/{src}", content)],
            _same(dst, "expected") + _same(f"data/{src}", "expected"), {"expected": content},
            [f"cp data/{src} {dst}"])


def delete_ext(rng: random.Random) -> Spec:
    ext, others = rng.sample(EXTS, 2)
    doomed = sorted({f"{rng.choice(WORDS)}{i}.{ext}" for i in range(rng.randint(2, 5))})
    keep = sorted({f"{rng.choice(WORDS)}{i}.{others}" for i in range(rng.randint(2, 4))}) + [f"sub/inner.{ext}"]
    setup = [_write(f, "x\n") for f in doomed + keep]
    test = f"ls ./*.{ext} >/dev/null 2>&1 && fail '.{ext} files remain'\n" + "".join(
        f"[ -f {shlex.quote(f)} ] || fail '{f} was deleted'\n" for f in keep)
    return (f"Delete every file whose name ends in .{ext} in the current directory, but not in its subdirectories. "
            f"Keep all other files.", setup, test, {}, [f"rm -- ./*.{ext}"])


def move_error_log(rng: random.Random) -> Spec:
    tag = "".join(rng.choice("abcdef0123456789") for _ in range(6))
    logs = {f"logs/app-{d:02d}.log": _lines(rng, 2) for d in rng.sample(range(1, 29), rng.randint(2, 5))}
    error = f"logs/error-{tag}.log"
    logs[error] = _lines(rng, 3)
    return ("The folder logs/ holds exactly one file whose name starts with 'error'. Move it into the current "
            "directory under the name errors.log.", [_write(p, c) for p, c in sorted(logs.items())],
            _same("errors.log", "expected")
            + "ls logs/error* >/dev/null 2>&1 && fail 'the error log is still in logs/'\n",
            {"expected": logs[error]}, ["ls logs", "mv logs/error-* errors.log"])


def find_key(rng: random.Random) -> Spec:
    value = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(10))
    files = {f"notes/{w}.txt": _lines(rng, rng.randint(2, 5)) for w in rng.sample(WORDS, rng.randint(3, 7))}
    target = rng.choice(sorted(files))
    lines = files[target].splitlines(keepends=True)
    lines.insert(rng.randint(0, len(lines)), f"KEY={value}\n")
    files[target] = "".join(lines)
    return ("One file under notes/ contains a line of the form KEY=<value>. Write only the value, on one line, to "
            "key.txt in the current directory.", [_write(p, c) for p, c in sorted(files.items())],
            _same("key.txt", "expected"), {"expected": value + "\n"},
            ["grep -r 'KEY=' notes", "grep -rh '^KEY=' notes | cut -d= -f2 > key.txt"])


def count_status(rng: random.Random) -> Spec:
    statuses = ("200", "301", "404", "500")
    rows = [f"GET /{rng.choice(WORDS)}/{rng.choice(WORDS)} {rng.choice(statuses)}" for _ in range(rng.randint(8, 30))]
    code = rng.choice(sorted({r.split()[-1] for r in rows}))
    count = sum(r.endswith(" " + code) for r in rows)
    return (f"access.log has one request per line; the last field is the HTTP status. Count the lines whose status "
            f"is {code} and write the number to count.txt.", [_write("access.log", "\n".join(rows) + "\n")],
            f'[ "$(tr -d " \\n" < count.txt)" = "{count}" ] || fail "count.txt is not {count}"\n', {},
            ["head -n 5 access.log", f"grep -c ' {code}$' access.log > count.txt"])


def largest_file(rng: random.Random) -> Spec:
    sizes = rng.sample(range(10, 400), rng.randint(3, 6))
    files = {f"data/{w}.dat": "".join(rng.choice("xyz") for _ in range(s)) for w, s in
             zip(rng.sample(WORDS, len(sizes)), sizes)}
    biggest = max(files, key=lambda p: len(files[p]))
    return ("Copy the largest file in data/ to biggest.dat in the current directory.",
            [_write(p, c) for p, c in sorted(files.items())], _same("biggest.dat", "expected"),
            {"expected": files[biggest]}, ["ls -lS data", 'cp "data/$(ls -S data | head -n 1)" biggest.dat'])


def csv_totals(rng: random.Random) -> Spec:
    names = rng.sample(NAMES, rng.randint(2, 4))
    rows = [(rng.choice(names), rng.randint(1, 99)) for _ in range(rng.randint(6, 14))]
    totals: dict[str, int] = {}
    for name, amount in rows:
        totals[name] = totals.get(name, 0) + amount
    expected = "".join(f"{n} {totals[n]}\n" for n in sorted(totals))
    csv = "name,amount\n" + "".join(f"{n},{a}\n" for n, a in rows)
    return ("sales.csv has a header line, then one sale per line as name,amount. Write totals.txt with one line per "
            "name, 'NAME TOTAL' (the sum of its amounts), sorted by name.", [_write("sales.csv", csv)],
            _same("totals.txt", "expected"), {"expected": expected},
            ["head -n 3 sales.csv",
             "tail -n +2 sales.csv | awk -F, '{t[$1]+=$2} END {for (n in t) print n, t[n]}' | sort > totals.txt",
             "cat totals.txt"])


def organize_by_ext(rng: random.Random) -> Spec:
    exts = rng.sample(EXTS, rng.randint(2, 3))
    files = {f"{w}.{rng.choice(exts)}": _lines(rng, 1) for w in rng.sample(WORDS, rng.randint(3, 7))}
    test = "[ -z \"$(ls -A inbox)\" ] || fail 'inbox is not empty'\n"
    extra = {}
    for i, (name, content) in enumerate(sorted(files.items())):
        extra[f"f{i}"] = content
        test += _same(f"{name.rsplit('.', 1)[1]}/{name}", f"f{i}")
    return ("Move every file in inbox/ into a directory named after its extension, in the current directory (for "
            "example inbox/a.txt goes to txt/a.txt). inbox/ must end up empty.",
            [_write(f"inbox/{n}", c) for n, c in sorted(files.items())], test, extra,
            ["ls inbox", 'for f in inbox/*; do e="${f##*.}"; mkdir -p "$e"; mv "$f" "$e/"; done', "ls -R"])


def replace_word(rng: random.Random) -> Spec:
    old, new = rng.sample(WORDS, 2)
    vocab = [w for w in WORDS if old not in w and w != new]
    files, expected = {}, {}
    for i, name in enumerate(rng.sample(vocab, rng.randint(3, 5))):
        path = f"docs/{'sub/' if i % 2 else ''}{name}.{'md' if i == 0 else 'txt'}"
        words = [rng.choice(vocab) for _ in range(12)]
        for k in rng.sample(range(12), rng.randint(1, 3)):
            words[k] = old
        files[path] = " ".join(words) + "\n"
        expected[path] = files[path] if path.endswith(".md") else files[path].replace(old, new)
    extra = {f"f{i}": expected[p] for i, p in enumerate(sorted(files))}
    test = "".join(_same(p, f"f{i}") for i, p in enumerate(sorted(files)))
    return (f"In every .txt file under docs/ (subfolders included), replace each occurrence of the word {old} with "
            f"{new}. Do not change any other file.", [_write(p, c) for p, c in sorted(files.items())], test, extra,
            [f"grep -rl {old} docs", f"find docs -name '*.txt' -exec sed -i 's/{old}/{new}/g' {{}} +"])


def archive_project(rng: random.Random) -> Spec:
    files = {f"project/{'src/' if i % 2 else ''}{w}.txt": _lines(rng, 2) for i, w in
             enumerate(rng.sample(WORDS, rng.randint(2, 5)))}
    extra = {p: c for p, c in files.items()}
    test = ("[ -e project ] && fail 'project/ still exists'\nrm -rf /tmp/x && mkdir /tmp/x && "
            "tar -xzf backup.tar.gz -C /tmp/x || fail 'backup.tar.gz is not a gzip tar archive'\n"
            "diff -r /tmp/x/project /tests/project >/dev/null || fail 'the archive does not hold project/'\n")
    return ("Pack the folder project/ into a gzip-compressed tar archive named backup.tar.gz (its paths starting "
            "with project/), then delete project/.", [_write(p, c) for p, c in sorted(files.items())], test, extra,
            ["ls -R project", "tar -czf backup.tar.gz project", "rm -r project"])


TEMPLATES: dict[str, tuple[int, Callable[[random.Random], Spec]]] = {
    "make_dir": (1, make_dir), "write_line": (1, write_line), "copy_file": (1, copy_file),
    "delete_ext": (1, delete_ext),
    "move_error_log": (2, move_error_log), "find_key": (2, find_key), "count_status": (2, count_status),
    "largest_file": (2, largest_file),
    "csv_totals": (3, csv_totals), "organize_by_ext": (3, organize_by_ext), "replace_word": (3, replace_word),
    "archive_project": (3, archive_project),
}


def build_task(template: str, index: int) -> TerminalTask:
    """Instance ``index`` of ``template``."""
    if template not in TEMPLATES:
        raise ValueError(f"template {template!r} is unknown; allowed: {', '.join(TEMPLATES)}")
    level, make = TEMPLATES[template]
    instruction, setup, test, extra, solution = make(random.Random(f"{template}:{index}"))
    return TerminalTask(
        name=f"{template}-{index:04d}", instruction=instruction + "\n",
        setup="set -e\n" + "".join(line + "\n" for line in setup),
        tests={"test.sh": TEST_HEADER + test + "exit 0\n", **extra},
        solution="#!/bin/bash\n" + "".join(c + "\n" for c in solution), max_turns=MAX_TURNS[level],
        metadata={"template": template, "level": level, "index": index})


def split_of(template: str, index: int) -> str:
    """``test`` or ``train``: held-out templates entirely, and a fixed 20% of the other instances."""
    if template in HELD_OUT_TEMPLATES:
        return "test"
    bucket = int(hashlib.sha256(f"{template}:{index}".encode()).hexdigest(), 16) % 100
    return "test" if bucket < TEST_PERCENT else "train"


def task_keys(split: str = "train", level: int = 0, per_template: int = 200) -> list[tuple[str, int]]:
    """(template, index) of the tasks in a split, in a fixed order."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split={split!r} is invalid: allowed: train, test, all")
    return [(t, i) for t, (lvl, _) in TEMPLATES.items() if level in (0, lvl) for i in range(per_template)
            if split == "all" or split_of(t, i) == split]


def generate_tasks(split: str = "train", level: int = 0, per_template: int = 200) -> list[TerminalTask]:
    """The generated tasks of a split (``level`` 0: all levels)."""
    return [build_task(t, i) for t, i in task_keys(split, level, per_template)]
