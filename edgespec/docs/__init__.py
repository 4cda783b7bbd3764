"""A venue's own documents on the device: an index built from them (chunks, a lexical and a dense
retriever), passages retrieved into a chat turn with their sources, and the whole store as a drafting
source. Layer: after `core`, before `drafters` (a drafter reads the document store; the engine retrieves)."""
