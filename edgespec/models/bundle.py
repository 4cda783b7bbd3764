"""Opening a bundle on the device: nothing is loaded until the manifest, every checksum and the
draft/target compatibility have been checked, so a corrupt or mismatched bundle fails with a list of
problems instead of garbage text or a crash deep inside onnxruntime.

`read_bundle` is the one strict reading of a bundle: Bundle.open and `edgespec verify` both run it,
so what verify accepts is exactly what the runtime loads. It adds to verify_bundle (schema, digest,
files inside the bundle, the facts against the graphs) the graphs' dtypes, draft/target
compatibility, the tokenizer parsed under a guard, and the chat template compiled and rendered
under a budget (models/template.py): two short chats whose prompts must hold the user's text, and a
long one that prices a message (models/template_process.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BundleCorrupt, BundleNotFound, TokenizerMismatch
from .bundlefiles import read_json
from .catalog import DEFAULT_BUNDLE
from .files import bundles_dir
from .bundlecheck import verify_bundle
from .manifest import MANIFEST_NAME, Manifest, ModelFacts

TOKENIZER_CONFIG = "tokenizer_config.json"
MAX_TOKENIZER_BYTES = 128 << 20  # the largest real tokenizer.json files are about 35 MB


@dataclass
class Reading:
    """What read_bundle found: the manifest (None when it could not be read), the problems (each
    one line naming a field or file), and the tokenizer it parsed (so it is not parsed twice)."""

    manifest: Manifest | None
    problems: list[str]
    mismatches: list[str] = field(default_factory=list)  # draft/target compatibility (TokenizerMismatch)
    tokenizer: Any = None


def read_bundle(root: str | os.PathLike, *, checksums: bool = True, template_cost: bool = True) -> Reading:
    """Every check a bundle must pass before anything of it is loaded (see the module docstring).
    `template_cost=False` accepts a chat template that costs too much per message (a service restarting
    with --no-verify on a bundle verified at install time); its renders are still priced and kept in
    their lane at request time (models/template_process.py)."""
    from .graphcheck import bundle_problems

    root = Path(root)
    manifest, problems = verify_bundle(root, checksums=checksums)
    if manifest is None or problems:
        return Reading(manifest, problems)
    problems += bundle_problems(root, manifest)  # each graph's flavor and dtypes vs the manifest
    tokenizer, more = _tokenizer(root, manifest)
    problems += more
    config, why = _config(root, manifest)
    if why:
        problems.append(why)
    template = manifest.tokenizer.chat_template
    if template is not None:
        from .template_process import examine

        seen = examine(template, bos_token=_text(config.get("bos_token")), eos_token=_text(config.get("eos_token")))
        said = seen.problem or (seen.cost if template_cost else None)
        if said:
            problems.append(f"manifest.json: tokenizer.chat_template {said}")
    return Reading(manifest, problems, compatibility_problems(manifest), tokenizer)


def _tokenizer(root: Path, manifest: Manifest) -> tuple[Any, list[str]]:
    """tokenizer.json parsed and tried on a few words; its size against usable_vocab."""
    from tokenizers import Tokenizer

    size = manifest.files["tokenizer.json"]["size"]  # checked against the file already
    if size > MAX_TOKENIZER_BYTES:  # parsed in one call that holds the GIL: SIGTERM would wait for it
        return None, [f"tokenizer.json: {size:,} bytes, over the {MAX_TOKENIZER_BYTES:,} this edgespec reads"]
    try:
        tok = Tokenizer.from_file(str(root / "tokenizer.json"))
        tok.decode(tok.encode("Hello, world", add_special_tokens=False).ids)
        size = tok.get_vocab_size(with_added_tokens=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - a Rust panic is a BaseException (pyo3's PanicException)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return None, [f"tokenizer.json: not a tokenizer this runtime can load ({type(e).__name__}: {first})"]
    from .derived import usable_problem

    said = usable_problem(manifest, size)
    return tok, [said] if said else []


def _config(root: Path, manifest: Manifest) -> tuple[dict, str | None]:
    """tokenizer_config.json when the bundle lists it ({} when not), parsed under a guard."""
    if TOKENIZER_CONFIG not in manifest.files:
        return {}, None
    d, why = read_json(root / TOKENIZER_CONFIG)
    if why:
        return {}, why
    if not isinstance(d, dict):
        return {}, f"{TOKENIZER_CONFIG}: not a JSON object"
    for key in ("bos_token", "eos_token"):
        v = d.get(key)
        if not (v is None or isinstance(v, str) or (isinstance(v, dict) and isinstance(v.get("content"), str))):
            return {}, f"{TOKENIZER_CONFIG}: {key} must be a string, {{\"content\": string}} or null"
    return d, None


def _text(v: Any) -> str:
    """A tokenizer_config token entry as text: "<s>" or {"content": "<s>", ...}."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else ""


@dataclass
class Bundle:
    root: Path
    manifest: Manifest
    _tokenizer: Any = field(default=None, repr=False, compare=False)  # parsed by read_bundle, handed out once

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = True) -> "Bundle":
        """`path` is a bundle folder (or its manifest.json) or the name of one under
        $EDGESPEC_HOME/bundles, resolved as the CLI resolves it (resolve_bundle), so
        `Engine.open("qwen-coder")` opens what `edgespec generate qwen-coder` opens.
        `verify=False` skips the sha256 pass (sizes and schema are still checked): for a service
        restarting on a bundle it verified at install time, where hashing 1.5 GB costs seconds."""
        root = resolve_bundle(path)
        if not root.exists():
            raise BundleNotFound(not_found_message(path))
        if root.is_file() and root.name == MANIFEST_NAME:
            root = root.parent
        reading = read_bundle(root, checksums=verify, template_cost=verify)
        if reading.problems or reading.manifest is None:
            raise BundleCorrupt(str(root), reading.problems)
        if reading.mismatches:
            raise TokenizerMismatch(f"bundle {root}: " + "; ".join(reading.mismatches))
        return cls(root=root, manifest=reading.manifest, _tokenizer=reading.tokenizer)

    # -- conveniences ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def target(self) -> ModelFacts:
        return self.manifest.models["target"]

    @property
    def draft(self) -> ModelFacts | None:
        return self.manifest.models.get("draft")

    def model_path(self, role: str) -> Path:
        return self.root / self.manifest.models[role].path

    def model_bytes(self, role: str) -> int:
        """Bytes on disk of one model's graph and weights (what loading it will roughly cost)."""
        folder = Path(self.manifest.models[role].path).parent.as_posix()
        return sum(e["size"] for rel, e in self.manifest.files.items() if Path(rel).parent.as_posix() == folder)

    def load_tokenizer(self):
        """A `tokenizers.Tokenizer` from the bundle's tokenizer.json (imported lazily: fast CLI start).
        The first call hands out the one Bundle.open parsed and checked; later calls parse again
        (each caller gets its own)."""
        tok, self._tokenizer = self._tokenizer, None
        if tok is not None:
            return tok
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.root / "tokenizer.json"))

    def tokenizer_config(self) -> dict:
        """tokenizer_config.json ({} when the bundle does not list it, or it cannot be used)."""
        return _config(self.root, self.manifest)[0]


def compatibility_problems(manifest: Manifest) -> list[str]:
    """Draft and target must score the same token ids: the draft's logits rows must cover the
    usable vocabulary the exporter recorded (padding rows past it are allowed to differ)."""
    problems = []
    usable = manifest.tokenizer.usable_vocab
    for role, facts in manifest.models.items():
        if role == "draft" and facts.vocab_map:  # a pruned draft head: its map says which ids it scores
            continue
        if facts.vocab_size < usable:
            problems.append(
                f"{role} model scores {facts.vocab_size} tokens but the tokenizer has {usable}: "
                "the bundle was built from mismatched models"
            )
    return problems


def resolve_bundle(name: str | os.PathLike) -> Path:
    """A path as given, or else a bundle of that name under $EDGESPEC_HOME/bundles (where
    `edgespec quickstart` puts its bundle). An unknown name comes back as given, so Bundle.open
    says what it looked for (not_found_message)."""
    p = Path(name).expanduser()
    if p.exists() or not _is_plain_name(name):
        return p
    cand = bundles_dir() / str(name)
    return cand if cand.exists() else p


def _is_plain_name(name: str | os.PathLike) -> bool:
    """A name like `qwen-coder` (one path component, not ~ or . or ..): looked up under bundles_dir()
    too. A path with a folder in it is only ever that path."""
    text = os.fspath(name)
    return bool(text) and "/" not in text and os.sep not in text and text not in (".", "..") \
        and not text.startswith("~")


def not_found_message(name: str | os.PathLike) -> str:
    """One line for a bundle that is not there: where it was looked for and how to make one (the
    CLI, `verify` and `Engine.open` all say this)."""
    given = Path(name).expanduser()
    if not _is_plain_name(name):
        return (f"bundle {given} does not exist: make one with `edgespec export --target MODEL -o {given}` "
                "(or `edgespec quickstart` for the default pair)")
    home = bundles_dir() / str(name)
    how = ("`edgespec quickstart` exports the default pair there" if str(name) == DEFAULT_BUNDLE
           else f"`edgespec export --target MODEL -o {home}` makes it")
    return (f"bundle {os.fspath(name)!r} not found: no folder {given.resolve()} and no {home} "
            f"($EDGESPEC_HOME/bundles); {how}; `edgespec models` lists the bundles present")
