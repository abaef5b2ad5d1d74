"""Public torch.distributed programs, unchanged, on every launch path: fetch, run, report (docs/launch-paths.md).

    python benchmarks/public_programs.py list
    python benchmarks/public_programs.py extract --into DIR --repo pytorch/examples=GIT_DIR [--repo OWNER/REPO=GIT_DIR]
    python benchmarks/public_programs.py run --folder DIR [--only REGEX] [--path PATH ...] [--try-cuda]
                                              [--repeat] [--timeout S] [--json FILE]

``extract`` copies each pinned file (``tests/support/public_programs.py``) out of a git clone or bare
repository that has its commit (``git show COMMIT:PATH``) into ``DIR/OWNER/REPO/PATH`` and checks
its sha256. ``run`` runs every program on every launch path that starts its style
(``tests/support/launch_paths.py``) and prints one markdown table (a row per program, a column per path)
and the details: each failure's error and each difference. ``--try-cuda`` also runs programs that
need CUDA on the paths without simulated GPUs, to record how they fail; ``--repeat`` runs the
simulator's paths twice and says whether the results are the same. ``--json`` keeps the outcomes.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

import public_programs as pp  # noqa: E402
from launch_paths import PATHS, SIM_PATHS, applies  # noqa: E402


def _list() -> int:
    for p in pp.PROGRAMS:
        recipe = (
            f" lines {', '.join(r if isinstance(r, str) else f'{r[0]}-{r[1]}' for r in p.recipe)}" if p.recipe else ""
        )
        print(f"{p.name}: {p.source.repo}@{p.source.commit[:12]} {p.source.path}{recipe}")
        print(f"    style {p.style}, world {p.world}, launches {list(p.launches)}, files {list(p.files)}")
        for what, value in (("needs CUDA", p.needs_cuda), ("same as", p.same_as), ("not runnable", p.unrunnable)):
            if value:
                print(f"    {what}: {value}")
        for path, why in p.known:
            print(f"    known to fail on {path}: {why}")
    return 0


def _extract(into: Path, repos: list[str]) -> int:
    dirs = dict(r.split("=", 1) for r in repos)
    status = 0
    sources = {(s.repo, s.commit, s.path): s for p in pp.PROGRAMS for s in (p.source, *p.beside)}
    for (repo, commit, path), source in sorted(sources.items()):
        if repo not in dirs:
            print(f"skipped {repo} {path}: no --repo {repo}=GIT_DIR")
            continue
        proc = subprocess.run(
            ["git", "--git-dir", dirs[repo], "show", f"{commit}:{path}"], capture_output=True, timeout=60, check=False
        )
        if proc.returncode != 0:
            print(f"failed {repo}@{commit[:12]} {path}: {proc.stderr.decode(errors='replace').strip()}")
            status = 1
            continue
        target = source.local(into)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(proc.stdout)
        problem = source.problem(into)
        print(f"{'wrote' if problem is None else 'MISMATCH'} {target}" + (f": {problem}" if problem else ""))
        status = status or int(problem is not None)
    return status


def _cell(program: pp.Program, outcome: pp.Outcome, reference: pp.Outcome | None) -> str:
    cuda = program.needs_cuda and outcome.path not in SIM_PATHS
    if outcome.status == "skipped":
        return "skipped: needs CUDA" if cuda else "skipped"
    if outcome.status == "failed":
        if cuda:
            return "failed: needs CUDA"
        timed_out = " (timed out)" if "timed out" in outcome.reason else ""
        return (
            f"failed{timed_out} (known, not simdist's)"
            if pp.known_failure(program, outcome.path)
            else f"**failed**{timed_out}"
        )
    same = reference is None or reference is outcome or pp.difference(reference, outcome) is None
    text = f"ran, {'same' if same else '**differs**'} ({outcome.seconds:.0f} s)"
    return text + (" [gloo, not simdist]" if outcome.engine_note else "")


def _run(opts: argparse.Namespace) -> int:
    root = Path(opts.folder)
    programs = [p for p in pp.PROGRAMS if re.search(opts.only or "", p.name)]
    paths = opts.path or list(PATHS)
    outcomes: dict[str, dict[str, pp.Outcome]] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="public-programs-") as tmp:
        for program in programs:
            row = outcomes.setdefault(program.name, {})
            for path in paths:
                if not applies(path, program.style) or (path.startswith("simdist.spawn") and program.spawn is None):
                    continue
                work = Path(tmp) / re.sub(r"\W+", "_", f"{program.name} {path}")
                row[path] = pp.run(program, path, root, work, opts.timeout, opts.try_cuda)
                print(
                    f"{program.name} | {path}: {row[path].status} {row[path].reason[:200]}", file=sys.stderr, flush=True
                )
                if opts.repeat and path in SIM_PATHS and row[path].status == "ran":
                    again = pp.run(program, path, root, work.with_name(work.name + "_again"), opts.timeout)
                    same = again.status == "ran" and pp.difference(row[path], again) is None
                    same = same and again.model == row[path].model
                    notes.append(
                        f"{program.name} on `{path}`: run twice, {'the same results' if same else 'DIFFERENT'}"
                    )
    _report(programs, paths, outcomes, notes)
    if opts.json:
        data = {name: {path: o.to_json() for path, o in row.items()} for name, row in outcomes.items()}
        Path(opts.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "outcomes": data}, indent=1) + "\n")
    return 0


def _report(programs: list[pp.Program], paths: list[str], outcomes: dict, notes: list[str]) -> None:
    used = [p for p in paths if any(p in row for row in outcomes.values())]
    print("| program | " + " | ".join(f"`{p}`" for p in used) + " |")
    print("|---|" + "---|" * len(used))
    details = []
    for program in programs:
        row = outcomes[program.name]
        first = next((o for o in row.values() if o.status == "ran"), None)
        print(
            f"| {program.name} | "
            + " | ".join(_cell(program, row[p], first) if p in row else "n/a" for p in used)
            + " |"
        )
        for path, o in row.items():
            if o.status == "failed":
                known = pp.known_failure(program, path)
                details.append(
                    f"- {program.name} on `{path}` failed: {o.reason}" + (f"; known: {known}" if known else "")
                )
            elif o.status == "ran" and first is not None and pp.difference(first, o):
                details.append(f"- {program.name} on `{path}` differs from `{first.path}`: {pp.difference(first, o)}")
            elif o.engine_note:
                details.append(f"- {program.name} on `{path}`: {o.engine_note}")
        if program.same_as and first is not None:
            other = outcomes.get(program.same_as, {})
            theirs = next((o for o in other.values() if o.status == "ran"), None)
            if theirs is not None:
                same = theirs.model == first.model
                details.append(
                    f"- {program.name}'s saved model {'equals' if same else 'DIFFERS from'} {program.same_as}'s"
                )
        skipped = {o.reason for o in row.values() if o.status == "skipped" and not o.reason.startswith("needs CUDA")}
        details += [f"- {program.name} skipped: {reason}" for reason in sorted(skipped)]
    print()
    print("\n".join(details + [f"- {n}" for n in notes]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print the pinned list")
    ex = sub.add_parser("extract", help="copy the pinned files out of git clones")
    ex.add_argument("--into", required=True, help="the folder to fill (then: export SIMDIST_PUBLIC_PROGRAMS=DIR)")
    ex.add_argument("--repo", action="append", default=[], metavar="OWNER/REPO=GIT_DIR")
    run = sub.add_parser("run", help="run the programs on every launch path")
    run.add_argument("--folder", default=pp.folder(), required=pp.folder() is None, help=f"default: ${pp.ENV}")
    run.add_argument("--only", help="programs whose name this regex finds")
    run.add_argument("--path", action="append", choices=list(PATHS), help="only these launch paths (repeatable)")
    run.add_argument("--try-cuda", action="store_true", help="run CUDA programs on paths without simulated GPUs too")
    run.add_argument("--repeat", action="store_true", help="run the simulator's paths twice and compare")
    run.add_argument("--timeout", type=float, default=90.0, help="seconds per launch (default 90)")
    run.add_argument("--json", help="write the outcomes here")
    opts = parser.parse_args(argv)
    if opts.command == "list":
        return _list()
    if opts.command == "extract":
        return _extract(Path(opts.into), opts.repo)
    return _run(opts)


if __name__ == "__main__":
    raise SystemExit(main())
