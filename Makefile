# The two commands a new user runs (each does all set-up itself):
#   make demo   — install, build, start Kafka + Redis, run the pipeline end to end
#   make test   — install, build, run the whole suite (unit, integration, sanitizers, fuzz)
# Other targets are for developers.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup build test demo unit integration asan fuzz services-up services-down clean

all: build

setup:
	scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

test:
	scripts/test.sh

demo:
	scripts/demo.sh

unit: build
	cd $(BUILD) && ctest -L unit --output-on-failure -j$(JOBS)

integration: build
	cd $(BUILD) && ctest -L integration --output-on-failure

asan: setup
	scripts/test.sh --asan-only

fuzz: setup
	scripts/test.sh --fuzz-only

services-up: setup
	scripts/services.sh up

services-down:
	scripts/services.sh down

clean:
	rm -rf $(BUILD) build-asan build-fuzz
