"""The Embedder on onnxruntime: an embedder folder (embedder_folder.py), checked, then run in batches.

Texts are tokenized by the model's own tokenizer and truncated to the manifest's max_tokens (256 for
all-MiniLM-L6-v2: the head of a longer text is embedded, the rest ignored; `Embedded.truncated` says
which), sorted by length and run BATCH at a time, each batch padded to its longest text only: the graph
masks the padding, so a text's vector does not depend on its batch-mates (up to float rounding).

    texts [n] -> input_ids, attention_mask int64 [batch, tokens] -> sentence_embedding float32 [batch, dim]
    -> vectors float32 [n, dim], each of L2 norm 1
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InvalidRequest
from .embedder_folder import EmbedderError, open_folder

BATCH = 32  # texts per onnxruntime run at most ...
BATCH_TOKENS = 2048  # ... and padded tokens per run at most: attention's activations grow with rows x tokens^2.
# Measured (MiniLM int8, 32 texts of 256 tokens): peak RSS 179 MB over the process at 2048 tokens a run, 304 MB
# at 8192, the same speed (edge/memory.py EMBEDDER_WORKING)


@dataclass(frozen=True)
class Embedded:
    vectors: np.ndarray  # float32 [n, dim], L2-normalised
    tokens: list[int]  # tokens each input was embedded with (special tokens included, after truncation)
    truncated: list[bool]  # the input was longer than max_tokens and only its head was embedded


class OnnxEmbedder:
    """Implements docs.embedder.Embedder. `threads`: onnxruntime's intra-op threads (None: its default);
    `providers`: onnxruntime provider names (None: the CPU, where a small encoder leaves the GPU to the LLM)."""

    def __init__(self, folder: str | Path, *, threads: int | None = None, providers: list[str] | None = None,
                 checksums: bool = True):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        self.manifest = m = open_folder(self.folder, checksums=checksums)
        self.model_id, self.dim, self.max_tokens = m.model_id, m.dim, m.max_tokens
        self.nbytes = sum(e["size"] for e in m.files.values())  # what the memory plan counts for it
        try:
            self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception for a JSON it cannot build
            raise EmbedderError(f"embedder {self.folder} refused: tokenizer.json does not load ({str(e)[:200]})") from None
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_tokens)
        self.vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.specials = [self.tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]")]
        if self.specials == [None, None]:  # XLM-R's vocabulary (multilingual-e5-small)
            self.specials = [self.tokenizer.token_to_id(t) for t in ("<s>", "</s>")]
        from ..models.catalog import MODELS

        known = MODELS.get(m.name)  # E5 embeds "query: ..." and "passage: ...", as it was trained
        self.query_prefix, self.passage_prefix = known.prefixes if known is not None else ("", "")
        try:
            self.session = make_session(str(self.folder / "model.onnx"), threads=threads, providers=providers)
        except Exception as e:
            raise EmbedderError(f"embedder {self.folder}: onnxruntime {ort.__version__} cannot load model.onnx "
                                f"({str(e).splitlines()[0][:200]})") from None

    @classmethod
    def open(cls, spec: str | Path | None = None, **kw) -> "OnnxEmbedder":
        """A folder path or a pulled model's name (None: the default embedder, catalog.DEFAULT_EMBEDDER)."""
        from .embedder_folder import resolve

        return cls(resolve(spec), **kw)

    # --- the protocol ------------------------------------------------------------------------------
    def embed(self, texts: list[str]) -> np.ndarray:
        """Passages' vectors (with the model's passage prefix)."""
        return self.encode(texts).vectors

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Questions' vectors (with the model's query prefix: E5 ranks "query: " against "passage: ")."""
        return self.encode(texts, query=True).vectors

    # --- with counts --------------------------------------------------------------------------------
    def encode(self, texts: list[str], *, query: bool = False) -> Embedded:
        """Texts -> vectors and token counts (as passages, or as questions with query=True: the prefixes
        the model was trained with, if any, go in front). A non-string item is an InvalidRequest naming its index."""
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise InvalidRequest(f"texts must be a list of strings, got {type(texts).__name__}", param="input")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InvalidRequest(f"input[{i}] is {type(t).__name__}, expected a string", param="input")
        prefix = self.query_prefix if query else self.passage_prefix
        encs = self.tokenizer.encode_batch([prefix + t for t in texts]) if texts else []
        ids = [list(e.ids) for e in encs]
        return self._run(ids, [bool(e.overflowing) for e in encs])

    def encode_ids(self, arrays: list[list[int]]) -> Embedded:
        """Token arrays (the embedding model's own ids, as `tokenize()` gives them, without [CLS]/[SEP]:
        those are added) -> vectors. Ids outside the vocabulary are an InvalidRequest naming the place."""
        out, cut = [], []
        room = self.max_tokens - sum(s is not None for s in self.specials)
        for i, arr in enumerate(arrays):
            if not isinstance(arr, (list, tuple)):
                raise InvalidRequest(f"input[{i}] is {type(arr).__name__}, expected a list of token ids", param="input")
            for j, t in enumerate(arr):
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab:
                    raise InvalidRequest(f"input[{i}][{j}] is {t!r}: token ids are integers in 0..{self.vocab - 1} "
                                         f"({self.model_id}'s vocabulary)", param="input")
            cut.append(len(arr) > room)
            head, tail = self.specials
            out.append(([head] if head is not None else []) + list(arr[:room]) + ([tail] if tail is not None else []))
        return self._run(out, cut)

    def tokenize(self, text: str) -> list[int]:
        """The ids encode_ids takes for `text` (no special tokens, no truncation)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _run(self, ids: list[list[int]], truncated: list[bool]) -> Embedded:
        n = len(ids)
        vectors = np.zeros((n, self.dim), np.float32)
        order = sorted(range(n), key=lambda i: len(ids[i]))
        for rows in _batches(order, [len(x) for x in ids]):
            t = max(1, max(len(ids[i]) for i in rows))
            x = np.full((len(rows), t), self.manifest.pad_id, np.int64)
            mask = np.zeros((len(rows), t), np.int64)
            for r, i in enumerate(rows):
                x[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1
            got = self.session.run(["sentence_embedding"], {"input_ids": x, "attention_mask": mask})[0]
            vectors[rows] = got
        return Embedded(vectors, [len(x) for x in ids], truncated)


def make_session(model: str | bytes, *, threads: int | None = None, providers: list[str] | None = None):
    """An onnxruntime session for an embedder graph, with its own threads, or on the process's global thread
    pool when the engine made one (onnxruntime then refuses per-session threads: edge/providers.py)."""
    import onnxruntime as ort

    def options(own_threads: bool):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if not own_threads:
            so.use_per_session_threads = False
        elif threads:
            so.intra_op_num_threads = int(threads)
            so.inter_op_num_threads = 1
        return so

    from ..edge.providers import shared_pool_active

    chain = providers or ["CPUExecutionProvider"]
    try:  # asked first: onnxruntime's refusal also prints an "EP Error" banner to stdout (chat --docs' answer)
        return ort.InferenceSession(model, options(not shared_pool_active()), providers=chain)
    except Exception as e:  # onnxruntime raises a plain RuntimeError for this
        if "global thread pool" not in str(e):
            raise
    return ort.InferenceSession(model, options(False), providers=chain)


def open_embedder(spec: str | Path) -> OnnxEmbedder:
    """The embedder an index names: its model_id, a pulled model's name, or a folder (embedder_folder.locate)."""
    from .embedder_folder import locate

    return OnnxEmbedder(locate(spec))


def _batches(order: list[int], lengths: list[int]) -> list[list[int]]:
    """`order` (indices by length, shortest first) cut into runs of at most BATCH rows and BATCH_TOKENS
    padded tokens (rows x the longest row's length)."""
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1 > BATCH or (len(cur) + 1) * max(lengths[i], 1) > BATCH_TOKENS):
            out.append(cur)
            cur = []
        cur.append(i)
    return out + ([cur] if cur else [])
