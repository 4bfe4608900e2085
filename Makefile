# kiln: the two quick-start commands are `make demo` and `make test` (see README.md).
# Everything is built with CMake; this file only strings the steps together.

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
DEMO_MODEL ?= models/tiny-cnn

V4_BUILD ?= build-v4
PY_BUILD ?= build-python
VENV ?= .venv
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
# CMake's Ninja generator where ninja is installed (tools/setup.sh installs it): it keeps every
# core busy across targets, where make's recursive build waits at the end of each target. A
# build folder made earlier keeps the generator it was made with.
CMAKE_GENERATOR ?= $(if $(shell command -v ninja 2>/dev/null),Ninja,Unix Makefiles)
export CMAKE_GENERATOR

.PHONY: all setup build demo test unit conformance python-install python-test python-sdist sanitize fuzz check-v4 format format-check tsan conformance-report ops-doc whisper-real vad-real clean

all: build

setup:
	@./tools/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The main job on a bundled model: run it, check it against its reference outputs, time it.
# Builds only what it runs (the library and onnx-run), not the tests and the other tools.
demo: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target onnx-run
	./$(BUILD)/tools/onnx-run $(DEMO_MODEL)/model.onnx --test-data $(DEMO_MODEL)/test_data_set_0 --warmup 3 --repeat 20

# Every test: unit tests and the conformance allow-list (release build, at each instruction-set
# level the processor runs), the Python package's tests, the library compiled for x86-64-v4,
# the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer, the concurrency
# tests under ThreadSanitizer, the fuzz harnesses for FUZZ_SECONDS each, and the formatting
# check.
test: build format-check
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) python-test
	$(MAKE) check-v4
	$(MAKE) sanitize
	$(MAKE) tsan
	$(MAKE) fuzz

# The library compiled with everything at -march=x86-64-v4 (AVX-512), warnings as errors:
# whatever processor builds it, code that only warns when AVX-512 is enabled fails here
# (as it would for a user building with KILN_NATIVE on an AVX-512 machine). Compiled only, and
# without precompiled headers, so that every warning is checked as a user's build would see it
# (cmake/precompiled_headers.cmake). The dispatched kernels' units are left out: each is
# compiled for its own level whatever the rest is built for, so they would be the release
# build's objects again.
check-v4: setup
	cmake -S . -B $(V4_BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-march=x86-64-v4 -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_TOOLS=OFF -DKILN_PCH=OFF
	cmake --build $(V4_BUILD) -j $(JOBS) --target kiln-baseline-objects

unit: build
	./$(BUILD)/test/kiln-unit-tests

# The package built into the venv against this build's library, installed into
# $(PY_BUILD)/kiln (only the extension module compiles here): python-test's and fuzz's.
python-install: build
	cmake --install $(BUILD) --prefix $(CURDIR)/$(PY_BUILD)/kiln >/dev/null
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
	  --config-settings=build-dir=$(CURDIR)/$(PY_BUILD)/module \
	  --config-settings=cmake.define.kiln_ROOT=$(CURDIR)/$(PY_BUILD)/kiln ./python

# The Python package (python/) built into the venv against this build's library, installed
# into $(PY_BUILD)/kiln (so only the extension module compiles here), then its pytest suite:
# parity with onnxruntime, zero copy, threads, errors, decoding, ONNX's backend tests, and
# kiln.serve on a local loopback Ray (marked `serve`: PYTEST_ARGS="-m 'not serve'" leaves it
# out); then the sdist is built and its contents checked (python-sdist).
PYTEST_ARGS ?=
python-test: python-install
	$(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_ARGS) python/tests
	$(MAKE) python-sdist

# The Python package's sdist, with kiln's C++ sources inside (tools/python-sdist.sh), into
# $(PY_BUILD)/dist, its contents checked. SDIST_WHEEL=1 also builds a wheel from it (a
# full compile of the library).
python-sdist: setup
	./tools/python-sdist.sh $(PY_BUILD)/dist $(if $(SDIST_WHEEL),--wheel)

conformance: build
	./$(BUILD)/test/kiln-conformance --check-allowlist test/conformance/allowlist.txt

# The libFuzzer harnesses (test/fuzz: model loader, tensor readers, random small graphs, audio
# files through read_audio),
# built with clang, ASan and UBSan, and the Python API's atheris harness
# (python/tests/fuzz: InferenceSession.run with hostile feeds, on the installed package),
# each run for FUZZ_SECONDS after replaying the committed regression inputs, one harness per
# core at a time. A finding fails the target. The build is unoptimised (-O0): clang compiles
# the library under ASan, UBSan and coverage instrumentation in a third of its -O1 time, which
# outweighs the slower executions in a run of a minute.
fuzz: setup python-install
	CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" -DKILN_FUZZ=ON -DKILN_BUILD_TESTS=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target kiln-fuzz_model kiln-fuzz_tensor kiln-fuzz_graph kiln-fuzz_audio
	./test/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# The sanitizer builds' optimisation: -Og compiles in about two thirds of -O1's time (GCC 12,
# with ASan and UBSan instrumentation) and keeps the programs fast enough to run every test.
SANITIZER_OPT ?= -Og -g1

# The unit tests under AddressSanitizer + UndefinedBehaviorSanitizer: every test case of
# kiln-unit-tests, listed by the binary itself and dealt into shards (8 per core) run JOBS at
# a time; the run fails unless the cases the shards ran add up to the list
# (test/build/run_shards.py).
sanitize: setup
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DCMAKE_CXX_FLAGS_DEBUG="$(SANITIZER_OPT)"
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target kiln-unit-tests
	cd $(ASAN_BUILD)/test && ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
	  UBSAN_OPTIONS=print_stacktrace=1 LSAN_OPTIONS=suppressions=$(CURDIR)/test/lsan.supp \
	  python3 $(CURDIR)/test/build/run_shards.py ./kiln-unit-tests --jobs $(JOBS)

# The concurrency tests ([concurrency]: many threads running one Session, sessions made and
# destroyed concurrently, runs stopped) under ThreadSanitizer: the library and that one test
# binary only, each case in its own process, JOBS at a time (ctest -L concurrency).
# test/tsan.supp names the oneTBB internals whose reports are false positives (see there).
tsan: setup
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKILN_TSAN=ON -DCMAKE_CXX_FLAGS_DEBUG="$(SANITIZER_OPT)"
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target kiln-concurrency-tests
	cd $(TSAN_BUILD) && \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/test/tsan.supp" \
	  ctest -L concurrency -j $(JOBS) --output-on-failure --no-tests=error

# Regenerates docs/conformance.md and adds newly passing cases to the allow-list.
conformance-report: build
	./$(BUILD)/test/kiln-conformance --report docs/conformance.md --write-allowlist test/conformance/allowlist.txt

# Regenerates docs/ops.md from the op registry.
ops-doc: build
	./$(BUILD)/tools/kiln-ops-doc docs/ops.md

# The real Whisper tiny.en export with speech files and transformers references, into
# models/cache/whisper-tiny.en (not committed; see models/README.md). Needs the export venv
# (tools/export/requirements-export.txt) and espeak-ng, sox and libsox-fmt-mp3.
PYTHON ?= .venv/bin/python

whisper-real:
	HF_HUB_OFFLINE=1 $(PYTHON) tools/export/make_whisper_real.py models/cache/whisper-tiny.en

# faster-whisper's Silero VAD (MIT), read out of the pinned faster-whisper wheel (sha256
# checked) by the corpus restore: models/cache/corpus/silero-vad-v6-fw/model.onnx.
vad-real:
	$(PYTHON) tools/bench/corpus_restore.py --only silero-vad-v6-fw

FORMAT_FILES = $(shell git ls-files '*.cpp' '*.h' 2>/dev/null)

format:
	clang-format -i $(FORMAT_FILES)

format-check: setup
	@clang-format --dry-run --Werror $(FORMAT_FILES) && echo "format-check: ok"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(V4_BUILD) $(PY_BUILD)
