"""The test suite's slowest tests, from the per-test seconds `scripts/test.sh` writes (issue 59).

    bash scripts/test.sh                       # writes outputs/tests/junit.xml (TEST_REPORT=FILE: elsewhere)
    python benchmarks/bench_suite.py [FILE] [--limit 30] [--top 25] [--json-out FILE]
                                     [--module-seconds-out tests/module_seconds.json]

Reads the JUnit file (each test's setup + call + teardown, so a module fixture's one launch is
charged to the first test that uses it), prints the slowest tests and the worker-seconds they take,
and flags every test over `--limit` seconds (default 30): a test that long on a fast machine is a
minute on a 2-core VM half as fast, where the whole command must stay within 10 minutes. Exits 1
when any test is flagged, so CI can run it after the suite. Not a unit test: it measures the run
it is given, on the machine and load that run had. `--module-seconds-out` writes each test module's
seconds, the order tests/conftest.py hands the modules to the workers in (longest first).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from common import RESULTS_DIR, machine_info, write_json

DEFAULT_REPORT = Path(__file__).resolve().parents[1] / "outputs" / "tests" / "junit.xml"
LIMIT_S = 30.0


def test_seconds(report: Path) -> tuple[dict[str, float], float]:
    """{test id: seconds} of every test case in the JUnit file `report`, and the run's wall seconds
    (the test suite's `time`; with pytest-xdist the workers' seconds add up to more than that)."""
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    seconds: dict[str, float] = {}
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"  # tests.test_foo::test_bar[case]
        seconds[test_id] = seconds.get(test_id, 0.0) + float(case.get("time") or 0.0)
    return seconds, sum(float(s.get("time") or 0.0) for s in suites)


def write_module_seconds(seconds: dict[str, float], out: Path) -> None:
    """Each test module's seconds ({"tests/test_foo.py": s}, longest first) into `out`."""
    per_module: dict[str, float] = {}
    for test_id, s in seconds.items():
        module = test_id.split("::")[0].replace(".", "/") + ".py"  # tests.test_foo -> tests/test_foo.py
        per_module[module] = per_module.get(module, 0.0) + s
    ranked = sorted(per_module.items(), key=lambda item: item[1], reverse=True)
    out.write_text(json.dumps({module: round(s, 1) for module, s in ranked}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("report", nargs="?", type=Path, default=DEFAULT_REPORT,
                        help=f"the JUnit file scripts/test.sh wrote (default {DEFAULT_REPORT})")
    parser.add_argument("--limit", type=float, default=LIMIT_S, help=f"flag tests over this many seconds (default {LIMIT_S:g})")
    parser.add_argument("--top", type=int, default=25, help="slowest tests listed (default 25)")
    parser.add_argument("--json-out", default=str(RESULTS_DIR / "bench_suite.json"), help="where the JSON goes ('-' = nowhere)")
    parser.add_argument("--module-seconds-out", type=Path, default=None,
                        help="also write each test module's seconds here (tests/module_seconds.json: the suite's order)")
    args = parser.parse_args(argv)
    if not args.report.is_file():
        print(f"error: {args.report} not found: run `bash scripts/test.sh` first (it writes it)", file=sys.stderr)
        return 2

    seconds, wall = test_seconds(args.report)
    ranked = sorted(seconds.items(), key=lambda item: item[1], reverse=True)
    total = sum(seconds.values())
    over = [(test, s) for test, s in ranked if s > args.limit]
    shown = ranked[:max(args.top, len(over))]  # every flagged test, however many
    print(f"slowest {len(shown)} of {len(ranked)} tests ({args.report}):")
    for test, s in shown:  # the id last and whole: it is what a reader looks up
        print(f"{s:8.1f} s  {'OVER' if s > args.limit else '    '}  {test}")
    print(f"{total:,.0f} test-seconds over the workers, {wall:,.0f} s of wall clock; "
          f"these {len(shown)} take {sum(s for _, s in shown):,.0f} s")
    print(f"{len(over)} test(s) over {args.limit:g} s" if over else f"no test over {args.limit:g} s")
    if args.module_seconds_out is not None:
        write_module_seconds(seconds, args.module_seconds_out)
    write_json(args.json_out, "bench_suite", {"report": str(args.report), "limit_s": args.limit},
               {"tests": len(ranked), "test_seconds": total, "wall_s": wall, "over_limit": dict(over),
                "slowest": dict(shown)}, machine_info())
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
