"""The workstation half of edgespec: model sources -> a verified ONNX bundle (imports as edgespec_export).

It needs the runtime (the `edgespec` package: bundle schema, limits, the CLI that runs `edgespec export`), which
export/pyproject.toml does not require: no PyPI name `edgespec` is this project's, so the runtime is installed from
the same checkout (`pip install . ./export`), and without it this import is one line saying so."""
import importlib.util as _util

if _util.find_spec("edgespec") is None:
    raise ImportError("edgespec-export needs the edgespec runtime from the same checkout: pip install . ./export "
                      "(from the repository root; on a Jetson add '[server]' to '.', never '[cpu]': docs/jetson.md)")
