# Shorthands for the scripts, which are the documented entry points.
.PHONY: demo test build bench
demo:
	./scripts/demo.sh
test:
	./scripts/test.sh
build:
	cargo build --release -p larder
bench: build
	bench/suite.py
