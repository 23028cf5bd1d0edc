"""The external-tool gates: skipped with a clear line locally, failed in CI."""

import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))


NEEDS_TOOL = """
    from conftest import gate

    @gate("no-such-checker", False)
    def test_uses_the_tool():
        assert False, "must not run without the tool"
"""


def run_pytest(tmp_path, require, source=NEEDS_TOOL, **env_extra):
    test = tmp_path / "test_needs_tool.py"
    test.write_text(textwrap.dedent(source))
    # a conftest that takes the gate machinery from clnn's own tests/conftest.py
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "clnn_tests_conftest", {os.path.join(HERE, "conftest.py")!r})
        clnn_conftest = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(clnn_conftest)
        gate = clnn_conftest.gate
        pytest_configure = clnn_conftest.pytest_configure
        pytest_runtest_setup = clnn_conftest.pytest_runtest_setup
        pytest_collection_modifyitems = clnn_conftest.pytest_collection_modifyitems
        pytest_runtest_logreport = clnn_conftest.pytest_runtest_logreport
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE),
                                                       os.environ.get("PYTHONPATH", "")]))
    for name in ("CLNN_REQUIRE_GATES", "CLNN_TEST_RECORD", "CLNN_TEST_RESUME",
                 "CLNN_TEST_FACTS"):      # (CLNN_TEST_FACTS: facts_mode.py is not on
        env.pop(name, None)               # this path)
    env.update(env_extra)
    if require:
        env["CLNN_REQUIRE_GATES"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider",
                           str(test)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_missing_tool_is_a_clear_skip(tmp_path):
    res = run_pytest(tmp_path, require=False)
    assert res.returncode == 0, res.stdout
    assert "SKIPPED" in res.stdout and "no-such-checker not installed" in res.stdout


def test_missing_tool_fails_when_gates_are_required(tmp_path):
    res = run_pytest(tmp_path, require=True)
    assert res.returncode == 1, res.stdout
    assert "CLNN_REQUIRE_GATES is set" in res.stdout


def test_a_recorded_run_resumes_where_it_stopped(tmp_path):
    """CLNN_TEST_RECORD notes every test's outcome; CLNN_TEST_RESUME leaves out the
    tests a record names, so a run cut off by a time limit goes on in the next."""
    import conftest
    three = """
        import pytest

        def test_passes():
            pass

        def test_fails():
            assert False

        def test_skips():
            pytest.skip("not here")
    """
    first, second = tmp_path / "first.tsv", tmp_path / "second.tsv"
    res = run_pytest(tmp_path, False, three, CLNN_TEST_RECORD=str(first))
    assert res.returncode == 1, res.stdout
    ids = {f"test_needs_tool.py::{n}": o for n, o in
           (("test_passes", "passed"), ("test_fails", "failed"), ("test_skips", "skipped"))}
    assert conftest.recorded(str(first)) == ids
    # the second run: the same three and one more; only the new one runs
    res = run_pytest(tmp_path, False, three + """
        def test_new():
            pass
    """, CLNN_TEST_RECORD=str(second), CLNN_TEST_RESUME=str(first))
    assert res.returncode == 0, res.stdout
    assert "1 passed, 3 deselected" in res.stdout, res.stdout
    assert conftest.recorded(str(second)) == {"test_needs_tool.py::test_new": "passed"}
    assert conftest.recorded(str(tmp_path / "none.tsv")) == {}
