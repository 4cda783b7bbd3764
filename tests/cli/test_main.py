"""The top-level command line: a command of an absent distribution answers with its install line
whatever options it is given; every other command still refuses unknown options."""
from __future__ import annotations

import pytest

import edgespec.cli.main as cli


@pytest.mark.parametrize("argv", [
    ["export", "--target", "X.gguf"],  # options first: argparse alone said "unrecognized arguments"
    ["export", "--target", "X.gguf", "--draft-model", "D.gguf", "-o", "out", "--ep", "cuda"],
    ["export"],
    ["-v", "export", "-o", "out"],
])
def test_export_on_a_runtime_only_install_names_the_install(monkeypatch, capsys, argv):
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["edgespec export: error: the export half of edgespec is not installed: " + cli.PLUGGED["export"]]


def test_other_commands_still_refuse_unknown_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["verify", "some-bundle", "--no-such-flag"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "edgespec: error: unrecognized arguments: --no-such-flag"


def test_a_reader_that_goes_away_is_not_a_traceback(tiny_bundle):
    """`edgespec plan B | head -1`: the pipe closes under the command's next write."""
    import subprocess
    import sys

    script = ("import sys\n"
              "class Gone:\n"
              "    def write(self, s): raise BrokenPipeError(32, 'Broken pipe')\n"
              "    def flush(self): raise BrokenPipeError(32, 'Broken pipe')\n"
              "sys.stdout = Gone()\n"
              "from edgespec.cli.main import main\n"
              f"sys.exit(main(['plan', {str(tiny_bundle)!r}]))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 141 and r.stderr == ""
