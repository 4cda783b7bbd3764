# Shortcuts; the README's two commands are ./scripts/quickstart.sh and ./scripts/test.sh.
.PHONY: quickstart test test-fast test-arm64

quickstart:
	./scripts/quickstart.sh

test:
	./scripts/test.sh

test-fast:
	./scripts/test.sh -m "not slow"

# The device runtime's tests on an emulated aarch64 Debian (needs root; first run builds it, ~8 min).
test-arm64:
	$(if $(filter 0,$(shell id -u)),,sudo) ./scripts/test-arm64.sh
