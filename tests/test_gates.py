"""The external-tool gates: skipped with a clear line locally, failed in CI."""

import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))


def run_pytest(tmp_path, require):
    test = tmp_path / "test_needs_tool.py"
    test.write_text(textwrap.dedent("""
        from conftest import gate

        @gate("no-such-checker", False)
        def test_uses_the_tool():
            assert False, "must not run without the tool"
    """))
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
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE),
                                                       os.environ.get("PYTHONPATH", "")]))
    env.pop("CLNN_REQUIRE_GATES", None)
    env.pop("CLNN_TEST_FACTS", None)      # (its facts_mode.py is not on this path)
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
