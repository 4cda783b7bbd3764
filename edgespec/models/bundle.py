"""Opening a bundle on the device: nothing is loaded until the manifest, every checksum and the
draft/target compatibility have been checked, so a corrupt or mismatched bundle fails with a list of
problems instead of garbage text or a crash deep inside onnxruntime."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import BundleCorrupt, BundleNotFound, TokenizerMismatch
from .files import bundles_dir
from .manifest import MANIFEST_NAME, Manifest, ModelFacts, verify_bundle


@dataclass
class Bundle:
    root: Path
    manifest: Manifest

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = True) -> "Bundle":
        """`verify=False` skips the sha256 pass (sizes and schema are still checked): for a service
        restarting on a bundle it verified at install time, where hashing 1.5 GB costs seconds."""
        root = Path(path).expanduser()
        if not root.exists():
            raise BundleNotFound(f"bundle {root} does not exist (create one with `edgespec export`)")
        if root.is_file() and root.name == MANIFEST_NAME:
            root = root.parent
        manifest, problems = verify_bundle(root, checksums=verify)
        if problems or manifest is None:
            raise BundleCorrupt(str(root), problems)
        problems = compatibility_problems(manifest)
        if problems:
            raise TokenizerMismatch(f"bundle {root}: " + "; ".join(problems))
        return cls(root=root, manifest=manifest)

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
        """A `tokenizers.Tokenizer` from the bundle's tokenizer.json (imported lazily: fast CLI start)."""
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.root / "tokenizer.json"))

    def tokenizer_config(self) -> dict:
        p = self.root / "tokenizer_config.json"
        return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


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
    says clearly that it does not exist."""
    p = Path(name).expanduser()
    if p.exists():
        return p
    cand = bundles_dir() / str(name)
    return cand if cand.exists() else p
