"""The bundle read as untrusted bytes (issue 23): symbolic links out of the bundle, files that are not
what their names say, manifests built to break a JSON reader, and chat templates built to hang or
balloon. Each is one line from `verify` (exit 1) and from the loader (BundleCorrupt), and `serve`
exits 78 on it."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from edgespec.cli.main import main
from edgespec.errors import BundleCorrupt
from edgespec.models.bundle import Bundle
from helpers.cli import verify
from helpers.manifests import rewrite_manifest

# a bomb that is not refused hangs or eats memory: the subprocess deadline makes that a loud failure
DEADLINE_S = 120


def _relist(b, rel):
    """Re-lists one file's size and sha256 (and re-signs the digest): the bytes are then 'as exported'."""
    data = (b / rel).read_bytes()
    rewrite_manifest(b, lambda d: d["files"][rel].update(size=len(data), sha256=hashlib.sha256(data).hexdigest()))


def _refused(b, line):
    """`verify` says exactly `line` (exit 1) and the loader raises BundleCorrupt with it."""
    rc, lines = verify(b, "--fast")
    assert (rc, lines) == (1, [f"{b}: {line}", f"{b}: NOT OK (1 problem(s))"])
    with pytest.raises(BundleCorrupt) as e:
        Bundle.open(b, verify=False)
    assert e.value.problems == [line]


@pytest.mark.parametrize("rel", ["tokenizer.json", "target/model.onnx.data", "tokenizer_config.json"])
def test_a_file_linked_out_of_the_bundle_is_refused(tiny_bundle, bundle_copy, tmp_path, rel):
    b = bundle_copy(tiny_bundle)
    outside = tmp_path / "elsewhere" / rel.replace("/", "_")
    outside.parent.mkdir(exist_ok=True)
    os.replace(b / rel, outside)  # the very bytes the manifest lists: only the link is wrong
    (b / rel).symlink_to(outside)
    _refused(b, f"{rel}: a symbolic link out of the bundle (to {outside}): refused")


def test_a_link_to_etc_passwd_relisted_is_refused(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    (b / "tokenizer_config.json").unlink()
    (b / "tokenizer_config.json").symlink_to("/etc/passwd")
    _relist(b, "tokenizer_config.json")  # size and sha256 of /etc/passwd: the link is all that is wrong
    _refused(b, "tokenizer_config.json: a symbolic link out of the bundle (to /etc/passwd): refused")


def test_a_folder_linked_out_of_the_bundle_is_refused(tiny_bundle, bundle_copy, tmp_path):
    b = bundle_copy(tiny_bundle)
    os.replace(b / "target", tmp_path / "target")
    (b / "target").symlink_to(tmp_path / "target")
    rc, lines = verify(b)
    assert rc == 1 and lines[:2] == [f"{b}: target/model.onnx: a symbolic link out of the bundle (to {tmp_path}/target/"
                                     "model.onnx): refused",
                                     f"{b}: target/model.onnx.data: a symbolic link out of the bundle (to "
                                     f"{tmp_path}/target/model.onnx.data): refused"]


def test_a_link_inside_the_bundle_is_fine(tiny_bundle, bundle_copy):
    """Links are not banned, leaving is: a bundle copied with its files linked to a sibling copy."""
    b = bundle_copy(tiny_bundle)
    os.replace(b / "tokenizer.json", b / "target" / "tok.json")
    (b / "tokenizer.json").symlink_to("target/tok.json")
    rewrite_manifest(b, lambda d: d["files"].update({"target/tok.json": d["files"]["tokenizer.json"]}))
    assert verify(b)[0] == 0


@pytest.mark.parametrize("content, why", [
    (b"\x00garbage\xff" * 10, "tokenizer.json: not a tokenizer this runtime can load ("),
    (b"{}", "tokenizer.json: not a tokenizer this runtime can load ("),
])
def test_a_tokenizer_that_does_not_parse_is_one_line(tiny_bundle, bundle_copy, content, why):
    b = bundle_copy(tiny_bundle)
    (b / "tokenizer.json").write_bytes(content)
    _relist(b, "tokenizer.json")
    rc, lines = verify(b)
    assert rc == 1 and len(lines) == 2 and lines[0].startswith(f"{b}: {why}") and "\n" not in lines[0]
    with pytest.raises(BundleCorrupt, match="not a tokenizer this runtime can load"):
        Bundle.open(b)


def test_a_truncated_graph_is_one_line(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    g = b / "target" / "model.onnx"
    g.write_bytes(g.read_bytes()[: g.stat().st_size // 2])
    _relist(b, "target/model.onnx")
    rc, lines = verify(b)
    assert rc == 1 and len(lines) == 2 and lines[0].startswith(f"{b}: target/model.onnx: not a readable ONNX graph")


@pytest.mark.parametrize("text, line", [
    ("[" * 200_000, "manifest.json: unreadable JSON: nested too deeply"),
    ('{"format_version": ' + "9" * 5000 + "}", "manifest.json: unreadable JSON: Exceeds the limit (4300 digits) for "
     "integer string conversion: value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit"),
    ("{}" + " " * (5 << 20), "manifest.json: 5,242,882 bytes, over the 4,194,304 this edgespec reads"),
    ('{"name": "\xff"}', "manifest.json: unreadable JSON: not UTF-8 text (byte 10)"),
])
def test_manifests_built_to_break_a_json_reader(tiny_bundle, bundle_copy, text, line):
    b = bundle_copy(tiny_bundle)
    (b / "manifest.json").write_bytes(text.encode("latin-1"))  # \xff: one byte that is not UTF-8
    _refused(b, line)


BOMBS = {
    "nested_ranges": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                      "loops or calls exceed the render budget (a template that never ends?)"),
    "string_times": ("{{ 'x' * 100000000 }}",
                     "'*' would make a value of 100,000,000 characters or items (limit 2,097,152)"),
    "recursive_macro": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
                        "recurses without end (a macro or loop that calls itself)"),
    "doubling": ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 "'~' would make a value of 4,194,304 characters or items (limit 2,097,152)"),
    "format_width": ("{{ '{:>1000000000}'.format(1) }}", "str.format: a format width of a million or more"),
    "power": ("{{ 7 ** 1000000000 }}", "'**' would make an integer of 3,000,000,000 bits (limit 65,536)"),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_template_bomb_is_refused_at_load(tiny_bundle, bundle_copy, name):
    """As a user meets it: `edgespec verify` in its own process, which must answer before the
    deadline (a hang is a loud TimeoutExpired, not a slow pass)."""
    template, why = BOMBS[name]
    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d["tokenizer"].update(chat_template=template))
    r = subprocess.run([sys.executable, "-m", "edgespec", "verify", "--fast", str(b)], capture_output=True,
                       text=True, timeout=DEADLINE_S)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines() == [f"{b}: manifest.json: tokenizer.chat_template {why}", f"{b}: NOT OK (1 problem(s))"]
    assert r.stderr == ""


def test_serve_exits_78_on_a_template_bomb_and_a_link_out(tiny_bundle, bundle_copy, tmp_path, capsys):
    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d["tokenizer"].update(chat_template=BOMBS["string_times"][0]))
    assert main(["serve", str(b), "--port", "0", "--no-warmup"]) == 78
    assert "tokenizer.chat_template '*' would make a value" in capsys.readouterr().err
    c = bundle_copy(tiny_bundle, "linked")
    os.replace(c / "tokenizer.json", tmp_path / "tok.json")
    (c / "tokenizer.json").symlink_to(tmp_path / "tok.json")
    assert main(["serve", str(c), "--port", "0", "--no-warmup"]) == 78
    err = capsys.readouterr().err
    assert "tokenizer.json: a symbolic link out of the bundle" in err and "Traceback" not in err


def test_a_template_that_fails_on_a_plain_conversation_is_refused(tiny_bundle, bundle_copy):
    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d["tokenizer"].update(chat_template="{{ raise_exception('no chat here') }}"))
    _refused(b, "manifest.json: tokenizer.chat_template refuses a plain user/assistant/user conversation: no chat here")
    rewrite_manifest(b, lambda d: d["tokenizer"].update(chat_template="{% for %}"))
    _refused(b, "manifest.json: tokenizer.chat_template does not compile: TemplateSyntaxError: Expected an expression, "
                "got 'end of statement block'")


def test_the_reader_reads_the_manifest_json_the_exporter_writes(tiny_bundle):
    """The untouched bundle passes every guard (the fuzz's starting point)."""
    from edgespec.models.manifest import FORMAT_VERSION

    assert json.loads((tiny_bundle / "manifest.json").read_text())["format_version"] == FORMAT_VERSION
    assert verify(tiny_bundle)[0] == 0


def test_a_template_that_only_blows_up_on_long_messages_is_a_400_per_request():
    """The probe's short conversation cannot show every bomb; the same budgets hold per request."""
    from edgespec.core.chat import render
    from edgespec.errors import InvalidRequest
    from edgespec.models.template_process import probe

    template = "{% for m in messages %}{% for i in range(m.content|length * 1000) %}{% endfor %}{{ m.content }}{% endfor %}"
    assert probe(template) is None
    assert render(template, [{"role": "user", "content": "hi"}]) == "hi"
    with pytest.raises(InvalidRequest, match="chat template was stopped: loops or calls exceed the render budget") as e:
        render(template, [{"role": "user", "content": "x" * 95}, {"role": "assistant", "content": "y" * 95}])
    assert e.value.param == "messages"


# the subtler bombs: shared references that print huge, generators joined, repeated format fields
MORE_BOMBS = {
    "{% set a = [[1] * 1000] * 1000 %}{{ [a] * 2000 }}": "'*' would make a value of 4,002,002,000",
    "{{ ('x' * 1000000).join(range(100)|map('string')) }}": "str.join would make a value of 100,000,290",
    "{{ range(100)|map('string')|join('x' * 2000000) }}": "filter join would make a value of 200,000,290",
    "{{ ('\\n' * 1000000)|indent(2000000) }}": "filter indent would make a value of 2,000,003,000,000",
    "{{ ('{0}' * 300000).format('x' * 2000000) }}": "str.format would make a value of 600,000,900,000",
    "{{ ('%(a)s' * 300000) % {'a': 'x' * 2000000} }}": "'%' would make a value of 600,002,700,000",
    "{{ ('x' * 1000000).translate(''.maketrans({'x': 'y' * 2000000})) }}": "str.translate would make a value of 2,000",
    "{% macro f(s, n) %}{{ f(s ~ s, n - 1) if n else s }}{% endmacro %}{{ f('x', 40) }}": "'~' would make a value",
    "{% set ns = namespace(x=2) %}{% set ns.x = 10 ** 18 %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}":
        "'*' would make an integer of 122,",
    "{{ cycler(10 ** 4000) }}": "call: argument of 13,288 bits is over the limit",
}


def test_the_subtler_bombs_are_sized_before_they_are_built():
    """All probed in one child process under a deadline and a memory cap: a bomb that gets through
    fails loudly (timeout, MemoryError) instead of taking the test machine down."""
    code = ("import json, resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
            "from edgespec.models.template_process import probe\n"
            "print(json.dumps([probe(t) for t in json.loads(sys.stdin.read())]))\n")
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(list(MORE_BOMBS)), capture_output=True,
                       text=True, timeout=DEADLINE_S)
    assert r.returncode == 0, r.stderr
    for (template, why), said in zip(MORE_BOMBS.items(), json.loads(r.stdout)):
        assert said is not None and said.startswith(why), (template, said)
