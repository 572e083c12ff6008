"""The runner of the tests/python scripts (no pytest needed): calls every test_*
function of a module, prints ok/FAIL per test and "N passed, N failed"."""
import traceback


def run_tests(namespace):
    """Runs the callables named test_* in `namespace` (a module's globals()), sorted by
    name. Returns the exit status: 1 if any failed, else 0."""
    tests = [(n, f) for n, f in sorted(namespace.items()) if n.startswith("test_") and callable(f)]
    passed = failed = 0
    for name, fn in tests:
        try:
            fn()
            passed += 1
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
