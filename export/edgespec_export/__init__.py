"""The workstation half of edgespec: model sources -> a verified ONNX bundle (imports as edgespec_export)."""
